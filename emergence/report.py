"""``python -m emergence.report``: the command; its code is ``emergence/panel/report.py``."""

from emergence.panel.report import main

if __name__ == "__main__":
    main()
