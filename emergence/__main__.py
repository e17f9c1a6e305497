from emergence.core.config import register_configs
from emergence.main import main

register_configs()  # before Hydra composes (conf/config.yaml names the schema); Hydra hands both to launched jobs
main()
