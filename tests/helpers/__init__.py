"""What the tests share: tiny models, independent reference implementations, local Hub servers,
the Hub twin, run directories and the command-line runner."""
