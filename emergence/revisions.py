"""``python -m emergence.revisions``: the command; its code is ``emergence/hub/revisions.py``."""

from emergence.hub.revisions import main

if __name__ == "__main__":
    main()
