"""The two checks of ``tests/test_cpu_engine.py`` that build SGLang objects without serving, in one
process (each fresh import of SGLang's engine costs about 8 s of CPU): the meta-device build
(``meta_build.py``: its ``META`` line) and then the start method (``start_method.py``: its
``START`` line; it sets the start method, which the build does not read). Same arguments."""

import json
import sys

from meta_build import main as meta_build
from start_method import start_methods

if __name__ == "__main__":
    print("META " + json.dumps(meta_build(sys.argv[1])), flush=True)
    print("START", *start_methods(sys.argv[1]))
