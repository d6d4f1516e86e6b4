"""At start, no experiment's trial values come back on their own.

A control-plane experiment sends each trial as the desired profiles plus its overlay
(``tune-<experiment>``), and the agent stores what it applied. A restarted agent that
re-applied that desired state would put trial values back with no experiment confirmed
running: the control plane may be gone, or the experiment over. So before anything else the
agent converges to its stored desired state without the overlays, which puts each trial
value's original back (journaled as usual). An experiment that is in fact still running loses
nothing: its trial was cut short by the restart anyway (the agent's fio died with it), and its
next trial's Apply sends the overlay again; a run that started without its values is not
counted (the control plane compares the run's settings with the trial's).
"""

from __future__ import annotations

from pathlib import Path

from stortune.agent import journal, local
from stortune.agent.kernelfs import KernelFS
from stortune.schemas import stripecache
from stortune.schemas.trialprofile import EXPERIMENT_ANNOTATION, is_overlay


def put_back(fs: KernelFS, state_dir: Path, *, ram_share: float = stripecache.DEFAULT_RAM_SHARE
             ) -> str | None:
    """Drop every trial overlay from the stored desired state, its values back to their
    originals; what was done, or None when there was no overlay."""
    desired = local.saved_desired(state_dir)
    if desired is None:
        return None
    overlays = {p.name: p.metadata.annotations[EXPERIMENT_ANNOTATION]
                for p in desired.profiles if is_overlay(p)}
    if not overlays:
        return None
    kept = [p for p in desired.profiles if p.name not in overlays]
    generations = {k: v for k, v in desired.generations.items() if k not in overlays}
    # Stored first: should the put-back fail, no later re-apply brings the trial values back, and
    # the next converge retries putting the originals back (no profile wants those values).
    journal.save_desired(state_dir, local.DesiredState(kept, generations, desired.ram_share).document())
    report = local.converge(fs, kept, state_dir, generations, ram_share=ram_share,
                            asked_share=desired.ram_share)
    experiments = ", ".join(sorted(overlays.values()))
    if not report.ok:
        raise local.AgentError(f"the trial values of experiment {experiments} could not be put back:"
                               f" {'; '.join(report.messages) or report.title}")
    return (f"experiment {experiments}: its trial values were put back, since no running experiment"
            f" confirms them ({report.title})")


def recover(fs: KernelFS, state_dir: Path, *, ram_share: float = stripecache.DEFAULT_RAM_SHARE
            ) -> str | None:
    """What an agent does first when it starts: ``local.recover`` (a cut-short transaction, an
    experiment of its own killed), then the control plane's trial values put back."""
    done = [local.recover(fs, state_dir, ram_share=ram_share), put_back(fs, state_dir, ram_share=ram_share)]
    return "; ".join(d for d in done if d) or None
