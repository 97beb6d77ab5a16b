"""homing for Python: run Python functions as homing jobs, with homing's guarantees.

    from homing import App, Retry, Fatal, Snooze

    app = App()   # HOMING_URL, HOMING_API_TOKEN

    @app.task(name="ocr.extract", queue="ocr", max_retries=2, retry_delay=30)
    def extract(ctx, document_id):
        ...

Run the tasks with `python -m homing worker MODULE`.
"""

from ._app import App, Job, NewWorkflow, Queue, Schedule, Task, Workflow
from ._context import Context
from ._errors import ApiError, Fatal, HomingError, Retry, Snooze, Unreachable

__all__ = [
    "ApiError",
    "App",
    "Context",
    "Fatal",
    "HomingError",
    "Job",
    "NewWorkflow",
    "Queue",
    "Retry",
    "Schedule",
    "Snooze",
    "Task",
    "Unreachable",
    "Workflow",
]
__version__ = "0.1.0"
