"""A stock Python Celery app with two tasks, run by `celery -A pytasks worker` in tests/celery.rs
to show that messages homing publishes are ordinary Celery messages. Broker and result backend
come from CELERY_BROKER and CELERY_BACKEND; the seeds' settings (acks_late, prefetch 1)."""
import os

from celery import Celery

app = Celery("pytasks", broker=os.environ["CELERY_BROKER"], backend=os.environ["CELERY_BACKEND"])
app.conf.task_acks_late = True
app.conf.worker_prefetch_multiplier = 1
app.conf.task_reject_on_worker_lost = True


@app.task(name="demo.add")
def add(x, y):
    return x + y


@app.task(name="demo.greet")
def greet(name, punctuation="!"):
    return f"hello, {name}{punctuation}"


@app.task(name="builtin.noop")
def noop(*args, **kwargs):
    """The Python twin of homing's builtin.noop, for the benchmark."""
    if args:
        return {"args": list(args), "kwargs": kwargs}
    return kwargs
