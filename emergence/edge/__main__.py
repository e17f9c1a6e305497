"""``python -m emergence.edge``: the command; its code is ``emergence/edge/command.py``."""

from emergence.edge.command import main

if __name__ == "__main__":
    main()
