"""In-process tests of one function or module each, on tiny models and hand-made inputs."""
