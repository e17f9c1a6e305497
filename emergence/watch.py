"""``python -m emergence.watch``: the command; its code is ``emergence/integrations/watch.py``. Ctrl-C is
handled from the first line on: an interrupt among the imports (torch, transformers) ends as one while
watching does, in one line and exit 130."""

import os
import sys

from emergence.run import interrupt

interrupt.install()
try:
    from emergence.integrations.watch import main

    if __name__ == "__main__":
        main()
except KeyboardInterrupt:  # before main's handling: nothing was written
    sys.stderr.write("interrupted: nothing written\n")
    sys.stderr.flush()
    os._exit(130)  # as python -m emergence: a Ctrl-C during the interpreter's shutdown must not change the status
