"""What is specific to one study and is neither a method, a task nor a rule: which runs and
outputs the study has (``runs``) and its paper's tables and figures (``report``)."""
