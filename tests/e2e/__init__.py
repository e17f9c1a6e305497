"""End-to-end tests: the commands as users run them (subprocesses, trained toys, local Hub servers);
their slow tests are marked ``slow``."""
