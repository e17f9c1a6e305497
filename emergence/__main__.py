"""``python -m emergence``. Ctrl-C is handled from the first line on: the imports (hydra,
transformers, torch) and Hydra's composing take seconds before ``main`` installs its own handling,
and an interrupt among them must end as one during the run does: one line, exit 130. An override
Hydra or the schema refuses ends as any bad input does: one line, exit 2 (Hydra would print its
message over several lines and exit 1; HYDRA_FULL_ERROR hands its exception to us instead)."""

import os
import sys

from emergence.run import interrupt

interrupt.install()
os.environ["HYDRA_FULL_ERROR"] = "1"
try:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from emergence.core.config import raised_by_hydra, refused_override, register_configs
    from emergence.main import main

    if interrupt.received.is_set():  # a library swallowed the KeyboardInterrupt while importing
        raise KeyboardInterrupt
    register_configs()  # before Hydra composes (conf/config.yaml names the schema); Hydra hands both to launched jobs
    try:
        main()
    except (HydraException, OmegaConfBaseException) as err:  # an override refused while composing
        sys.stderr.write(f"error: {refused_override(err)}\n")
        sys.exit(2)
    except (ValueError, OSError) as err:  # one Hydra raises looking up a group option (measures=null)
        if not raised_by_hydra(err):
            raise
        sys.stderr.write(f"error: {refused_override(err)}\n")
        sys.exit(2)
except KeyboardInterrupt:  # before main's handling (or after it): nothing was written
    sys.stderr.write("interrupted: no results written\n")
    sys.stderr.flush()
    # os._exit: a Ctrl-C that lands while the interpreter shuts down (a library's atexit hook) would
    # otherwise end the process by the signal (-2) instead of 130
    os._exit(130)
