"""``python -m emergence``. Ctrl-C is handled from the first line on: the imports (hydra,
transformers, torch) and Hydra's composing take seconds before ``main`` installs its own handling,
and an interrupt among them must end as one during the run does: one line, exit 130."""

import os
import sys

from emergence.run import interrupt

interrupt.install()
try:
    from emergence.core.config import register_configs
    from emergence.main import main

    if interrupt.received.is_set():  # a library swallowed the KeyboardInterrupt while importing
        raise KeyboardInterrupt
    register_configs()  # before Hydra composes (conf/config.yaml names the schema); Hydra hands both to launched jobs
    main()
except KeyboardInterrupt:  # before main's handling (or after it): nothing was written
    sys.stderr.write("interrupted: no results written\n")
    sys.stderr.flush()
    # os._exit: a Ctrl-C that lands while the interpreter shuts down (a library's atexit hook) would
    # otherwise end the process by the signal (-2) instead of 130
    os._exit(130)
