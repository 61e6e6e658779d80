"""What a run learns (a :class:`~fedmedbench.fl.tasks.base.Task`): the registry in ``base``, one
module or package per task. Kept empty so importing the registry loads no task."""
