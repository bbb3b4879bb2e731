"""A stock PyTorch worker using torchelastic's @record: rank 1 raises, which writes the
torchelastic error file ($TORCHELASTIC_ERROR_FILE) before the process exits 1."""
import os

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("intentional failure on rank 1")


if __name__ == "__main__":
    main()
