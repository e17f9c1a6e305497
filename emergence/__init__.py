"""emergence: when do attention circuits form during language-model pretraining?"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # ``from emergence import track`` imports torch and transformers only when asked: every other
    # module (the sweep's download process among them) imports this package without them
    if name == "track":
        from emergence.integrations.track import track

        return track
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
