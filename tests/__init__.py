"""The test suite: unit/ (in-process, fast), e2e/ (commands end to end: marked slow), helpers/."""
