"""The judge ("PRM") as asked over HTTP: backends, prompts, votes, the OPD teacher, one factory."""
