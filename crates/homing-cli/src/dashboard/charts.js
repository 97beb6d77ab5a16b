// charts
