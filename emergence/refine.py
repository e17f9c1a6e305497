"""``python -m emergence.refine``: the command; its code is ``emergence/panel/refine.py``."""

from emergence.panel.refine import main

if __name__ == "__main__":
    main()
