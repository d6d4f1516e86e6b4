"""How an experiment's trial overlay is named and told apart from every other profile.

Apart from ``stortune.schemas.tuning`` so that a serving agent, which never loads the tuning
engine, can recognise an overlay in its stored desired state (``stortune.agent.trials``).
"""

from __future__ import annotations

import hashlib

from stortune.schemas.profile import StorageProfile, is_name

#: Annotation naming the experiment a profile comes from.
EXPERIMENT_ANNOTATION = "stortune.io/experiment"
#: The highest priority a profile may have: the overlay's. At equal priority the name sorting
#: first wins, so a desired profile at this priority could still win (``overlay_conflicts``).
OVERLAY_PRIORITY = 1000
_PREFIX = "tune-"


def profile_name(experiment: str, prefix: str = _PREFIX) -> str:
    """``tune-<experiment>``, shortened with a hash when it would exceed a name's 253 characters."""
    name = prefix + experiment
    if len(name) <= 253 and is_name(name):
        return name
    digest = hashlib.sha256(experiment.encode()).hexdigest()[:10]
    return f"{prefix}{experiment[: 253 - len(prefix) - 11].rstrip('-.')}-{digest}"


def is_overlay(profile: StorageProfile) -> bool:
    """Whether ``profile`` is an experiment's trial overlay (not its recommended profile)."""
    experiment = profile.metadata.annotations.get(EXPERIMENT_ANNOTATION)
    return (experiment is not None and profile.spec.priority == OVERLAY_PRIORITY
            and profile.name == profile_name(experiment))
