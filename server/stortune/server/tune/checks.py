"""Submission-time checks of an experiment against the device it would tune on one host.

The document was checked against the catalog when it was read; here what depends on the
device: a tunable that does not apply to the device's kind or that its kernel does not
have, a value it does not take (a scheduler the kernel does not offer, a value above a
device bound), a parameter ``at: beneath`` on a device with nothing beneath it. Each
problem names the field, as the API's 422 does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stortune.schemas import catalog
from stortune.schemas.catalog import DeviceFacts, check_on_device
from stortune.schemas.topology import Device
from stortune.schemas.tuning.experiment import TuningExperiment


@dataclass(frozen=True)
class DeviceProblem:
    path: str
    message: str


def _facts(device: Device, tunable: str) -> DeviceFacts:
    state = device.tunables.get(tunable)
    if state is None:
        return DeviceFacts(kind=device.kind, supported=False, writable=False,
                           unsupported_reason="the agent reported no such attribute")
    return DeviceFacts(kind=device.kind, supported=state.supported, writable=state.writable,
                       choices=state.choices, maximum=state.maximum, unsupported_reason=state.reason)


def device_problems(exp: TuningExperiment, device: Device, beneath: Sequence[Device]) -> list[DeviceProblem]:
    problems: list[DeviceProblem] = []
    for i, parameter in enumerate(exp.spec.parameters):
        where = f"spec.parameters[{i}]"
        tunable = catalog.get(parameter.tunable)
        if parameter.at == "beneath":
            devices = [d for d in beneath if d.kind in tunable.applies_to]
            if not beneath:
                problems.append(DeviceProblem(f"{where}.at",
                                              f"beneath: {device.name} has no devices beneath it"))
                continue
            if not devices:
                kinds = sorted({d.kind.value for d in beneath})
                problems.append(DeviceProblem(
                    f"{where}.tunable", f"{parameter.tunable} applies to none of the devices beneath "
                                        f"{device.name} ({', '.join(kinds)})"))
                continue
        else:
            devices = [device]
        problem = _first(parameter, tunable, devices, where)
        if problem is not None:
            problems.append(problem)
    return problems


def _first(parameter: object, tunable: catalog.Tunable, devices: Sequence[Device], where: str
           ) -> DeviceProblem | None:
    from stortune.schemas.tuning.experiment import Parameter

    assert isinstance(parameter, Parameter)
    listed = parameter.values is not None
    for j, value in enumerate(parameter.choices()):
        for dev in devices:
            rejected = check_on_device(tunable, value, _facts(dev, parameter.tunable))
            if rejected is None:
                continue
            if not rejected.fatal:  # not applicable / not supported: the tunable, not the value
                return DeviceProblem(f"{where}.tunable", f"on {dev.name}: {rejected.reason}")
            path = f"{where}.values[{j}]" if listed else f"{where}.range"
            return DeviceProblem(path, f"on {dev.name}: {rejected.reason}")
    return None
