"""Run state that makes a job resumable bit for bit: the server checkpoint of each round (``checkpoint``),
client state that persists across rounds (``client_state``), the file format both are written in
(``file_format``), where a model's state entries live (``slots``) and a run's working files (``scratch``)."""
