"""Many runs at once: loading run directories (``runs``), findings, uncertainty, sensitivity,
figures and the report (``report``), refinement (``refine``) and the toy seeds' spread (``seeds``)."""
