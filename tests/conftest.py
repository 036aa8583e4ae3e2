"""Shared test setup."""
import pytest
import torch


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """Scripts called in-process (a benchmark's main with --threads 1, train.py with --threads)
    set torch's thread count for the whole process; without this, every later test ran on one
    of the machine's cores (test_train's end-to-end runs took 1.5x as long)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def warm_starts(tmp_path_factory):
    """Where the tiny model's warm starts live for the whole session. models.warm_start keys
    each by its settings, so the modules that ask for the same one (test_train, test_speed,
    test_cuda) build it once instead of once each."""
    return tmp_path_factory.mktemp("warm-starts")
