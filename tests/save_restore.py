"""One save-and-restore check for every kind of Loader: stop after any number of batches (mid-epoch, exactly at
an epoch's end, or into the next), save ``state_dict``, load it into a fresh Loader of the same configuration,
and the rest must equal an uninterrupted run tensor by tensor."""
import torch


def flatten(batch, prefix=""):
    """Every tensor of a batch (nested dicts included) by its path, and the sparse keys."""
    out = {}
    for key, value in batch.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        elif isinstance(value, torch.Tensor):
            out[prefix + key] = value.clone()
        else:
            out[prefix + key] = value
    return out


def run(make_loader, epochs: int):
    """Every batch of ``epochs`` epochs of a fresh loader, flattened."""
    loader = make_loader()
    try:
        return [flatten(b) for _ in range(epochs) for b in loader]
    finally:
        loader.close()


def resumed(make_loader, epochs: int, stop_after: int):
    """Take ``stop_after`` batches (over epoch boundaries), save, restore into a fresh loader, and take the rest
    of the ``epochs`` epochs from it: (batches before, batches after, the state, second loader)."""
    first = make_loader()
    before, epoch = [], 0
    while len(before) < stop_after:
        for batch in first:
            before.append(flatten(batch))
            if len(before) == stop_after:
                break
        else:
            epoch += 1
            continue
        break
    state = first.state_dict()
    # Where the state leaves the epoch: finished if the last batch taken was the epoch's last.
    epoch = first.epoch
    if state["complete"]:
        epoch += 1
    second = make_loader()
    second.load_state_dict(state)
    after = []
    for e in range(epoch, epochs):
        after += [flatten(b) for b in second]
    first.close()
    return before, after, state, second


def assert_same(a, b):
    assert len(a) == len(b)
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.keys() == y.keys(), k
        for key in x:
            if isinstance(x[key], torch.Tensor):
                assert torch.equal(x[key], y[key]), (k, key)
            else:
                assert x[key] == y[key], (k, key)


def check_save_restore(make_loader, epochs: int = 2, stops=None):
    """For each stop (default: the first batch, mid-epoch, the epoch's last batch, into the next epoch),
    the interrupted run equals the uninterrupted one."""
    reference = run(make_loader, epochs)
    per_epoch = len(reference) // epochs
    stops = stops or sorted({1, per_epoch // 2, per_epoch, per_epoch + 1})
    states = []
    for stop in stops:
        before, after, state, second = resumed(make_loader, epochs, stop)
        assert_same(before + after, reference)
        second.close()
        states.append(state)
    if per_epoch in stops:  # the state saved right after an epoch's last batch says the epoch is over
        assert states[stops.index(per_epoch)]["complete"]
    return reference
