"""Runs stock torchrun (python -m torch.distributed.run) with one repair: under Python 3.11,
Debian's PyTorch 1.13 `Std.from_str("0")` returns None, so torchrun crashes on its own default
`-r 0 -t 0`. This wrapper installs a correct parser, then calls torchrun's unchanged main().
Newer PyTorch does not need it; the wrapper leaves a working parser alone."""
import re
import sys

from torch.distributed.elastic.multiprocessing import api

if api.Std.from_str("0") is None:
    def _from_str(vm):
        if re.fullmatch(r"[0-3]", vm):
            return api.Std(int(vm))
        return {int(k): api.Std(int(v)) for k, v in (item.split(":") for item in vm.split(","))}
    api.Std.from_str = staticmethod(_from_str)

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "torchrun"
    main()
