"""emergence: when do attention circuits form during language-model pretraining?"""

__version__ = "0.1.0"
