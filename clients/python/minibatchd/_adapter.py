"""What the PyTorch and JAX adapters share: the session options they take from the user."""

from typing import Any, Dict

# The epoch limit and the worker split are the adapters' own.
OWN_OPTIONS = ("max_samples", "max_sweeps", "sweep", "num_workers", "rank")


def user_options(options: Dict[str, Any], adapter: str, split: str) -> Dict[str, Any]:
    """``options`` less ``full_sweep`` (which means what a pass does anyway), after refusing the
    options the adapter sets itself; ``split`` says how the adapter's split is set instead."""
    for key in OWN_OPTIONS:
        if key in options:
            raise ValueError(f"{key!r} is not an option of {adapter}: each pass is one sweep (set_epoch(k) picks "
                             f"sweep k) and the split is automatic ({split})")
    if "session" in options:
        # Every worker of every pass opens its own session; one name for all of them is busy
        # (`session_busy`) for all but one, and a later pass would meet the earlier one lingering.
        raise ValueError(f"'session' is not an option of {adapter}: it opens a session per worker and pass "
                         "and resumes them from state_dict(), not by name")
    if "minibatch_size" not in options:
        raise ValueError("minibatch_size is required")
    return {k: v for k, v in options.items() if k != "full_sweep"}
