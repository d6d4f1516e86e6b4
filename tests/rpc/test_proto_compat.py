"""An agent one release older than the control plane still works with it.

The previous release's agent.proto (tests/fixtures/proto/agent_v1_previous.proto) is compiled
into a descriptor pool of its own and compared with the current one: every message, field and
RPC it has is still there with the same number, type and cardinality (fields are only added),
and every message it sends is read by the current code and back without loss. The checker is
itself tried on breaking edits, so it cannot pass by seeing nothing. An RPC the old agent does
not have (StartProbe) fails through the real client as a rejection naming it, never as an
unreachable agent to retry forever.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc.aio
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.message import Message

from stortune.server.agentclient import AgentClients, AgentRejected

ROOT = Path(__file__).resolve().parents[2]
CURRENT = ROOT / "proto" / "stortune" / "api" / "agent" / "v1" / "agent.proto"
PREVIOUS = ROOT / "tests" / "fixtures" / "proto" / "agent_v1_previous.proto"
NAME = "stortune/api/agent/v1/agent.proto"


def compile_proto(source: Path, tmp: Path) -> FileDescriptor:
    """``source`` compiled as NAME into a pool of its own (both versions share one file name)."""
    tree = tmp / source.stem
    (tree / NAME).parent.mkdir(parents=True)
    (tree / NAME).write_text(source.read_text())
    out = tmp / f"{source.stem}.pb"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{tree}", f"--descriptor_set_out={out}",
                    NAME], check=True, cwd=tree)
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    return pool.FindFileByName(NAME)


def breaks(old: FileDescriptor, new: FileDescriptor) -> list[str]:
    """What in ``new`` an agent or control plane built from ``old`` would misread."""
    found = []
    for name, message in old.message_types_by_name.items():
        if name not in new.message_types_by_name:
            found.append(f"message {name} removed")
            continue
        now = new.message_types_by_name[name].fields_by_number
        for number, was in message.fields_by_number.items():
            field = now.get(number)
            if field is None:
                reserved = new.message_types_by_name[name]
                found.append(f"{name}.{was.name} (#{number}) removed"
                             + ("" if was.name in _reserved_names(reserved) else " without reserving it"))
            elif _shape(field) != _shape(was):
                found.append(f"{name}.{was.name} (#{number}) re-typed")
            elif field.name != was.name:
                found.append(f"{name}.{was.name} (#{number}) renamed to {field.name} (JSON names travel)")
    for name, enum in old.enum_types_by_name.items():
        now_enum = new.enum_types_by_name.get(name)
        for value in enum.values:
            if now_enum is None or now_enum.values_by_number.get(value.number) is None:
                found.append(f"enum {name}.{value.name} removed")
    for service in old.services_by_name.values():
        now_service = new.services_by_name.get(service.name)
        for method in service.methods:
            now_method = now_service.methods_by_name.get(method.name) if now_service else None
            if now_method is None:
                found.append(f"rpc {service.name}.{method.name} removed")
            elif ((now_method.input_type.full_name, now_method.output_type.full_name,
                   now_method.client_streaming, now_method.server_streaming)
                  != (method.input_type.full_name, method.output_type.full_name,
                      method.client_streaming, method.server_streaming)):
                found.append(f"rpc {service.name}.{method.name} changed its messages or streaming")
    return found


def _repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _shape(field: FieldDescriptor) -> tuple[int, bool, str]:
    return field.type, _repeated(field), _type_name(field)


def _type_name(field: FieldDescriptor) -> str:
    kind = field.message_type or field.enum_type
    return kind.full_name if kind is not None else ""


def _reserved_names(message: Descriptor) -> set[str]:
    proto = descriptor_pb2.DescriptorProto()
    message.CopyToProto(proto)
    return set(proto.reserved_name)


def filled(message: Message, depth: int = 0) -> Message:
    """Every field of ``message`` set to a value other than its default (nested two deep)."""
    for field in message.DESCRIPTOR.fields:
        value = _sample(field, depth)
        if value is None:
            continue
        if field.message_type is not None:
            if _repeated(field):
                filled(getattr(message, field.name).add(), depth + 1)
            else:
                filled(getattr(message, field.name), depth + 1)
        elif _repeated(field):
            getattr(message, field.name).append(value)
        else:
            setattr(message, field.name, value)
    return message


def _sample(field: FieldDescriptor, depth: int) -> object:
    if field.message_type is not None:
        if field.message_type.GetOptions().map_entry or depth >= 2:
            return None
        return True
    if field.enum_type is not None:
        return field.enum_type.values[-1].number
    return {FieldDescriptor.CPPTYPE_STRING: "x" if field.type == FieldDescriptor.TYPE_STRING else b"x",
            FieldDescriptor.CPPTYPE_BOOL: True, FieldDescriptor.CPPTYPE_DOUBLE: 1.5,
            FieldDescriptor.CPPTYPE_FLOAT: 1.5}.get(field.cpp_type, 7)


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FileDescriptor, FileDescriptor]]:
    tmp = tmp_path_factory.mktemp("protos")
    yield compile_proto(PREVIOUS, tmp), compile_proto(CURRENT, tmp)


def test_the_current_api_only_adds_to_the_previous_release(versions: tuple[FileDescriptor, FileDescriptor]
                                                           ) -> None:
    old, new = versions
    assert breaks(old, new) == []
    assert set(new.services_by_name["AgentService"].methods_by_name) > set(
        old.services_by_name["AgentService"].methods_by_name)  # the release since added RPCs


@pytest.mark.parametrize(("edit", "said"), [
    (("string device_id = 1;", "int64 device_id = 1;"), "re-typed"),
    (("string device_id = 1;", "string device_id = 41;"), "removed without reserving it"),
    (("  rpc GetObserved(GetObservedRequest) returns (GetObservedResponse);\n", ""),
     "rpc AgentService.GetObserved removed"),
    (("string device_id = 1;", "repeated string device_id = 1;"), "re-typed"),
])
def test_hostile_a_breaking_edit_is_caught(versions: tuple[FileDescriptor, FileDescriptor], tmp_path: Path,
                                           edit: tuple[str, str], said: str) -> None:
    old, _ = versions
    text = CURRENT.read_text()
    assert edit[0] in text, edit[0]
    broken = tmp_path / "broken.proto"
    broken.write_text(text.replace(edit[0], edit[1], 1))
    assert any(said in b for b in breaks(old, compile_proto(broken, tmp_path))), said


def test_every_message_of_the_previous_release_reads_back_without_loss(
        versions: tuple[FileDescriptor, FileDescriptor]) -> None:
    old, new = versions
    for name, kind in old.message_types_by_name.items():
        old_class = message_factory.GetMessageClass(kind)
        new_class = message_factory.GetMessageClass(new.message_types_by_name[name])
        sent = filled(old_class())
        assert sent.ByteSize() > 0 or not kind.fields, name
        read = new_class.FromString(sent.SerializeToString())
        assert old_class.FromString(read.SerializeToString()) == sent, name
        # and what the current side sends, the old side parses (new fields kept as unknown)
        back = old_class.FromString(filled(new_class()).SerializeToString())
        assert back.ByteSize() > 0 or not kind.fields, name


def test_an_rpc_the_older_agent_lacks_is_a_rejection_naming_it() -> None:
    async def scenario() -> AgentRejected:
        server = grpc.aio.server()  # an agent that serves none of the newer RPCs
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            client = AgentClients().for_address(f"127.0.0.1:{port}")
            with pytest.raises(AgentRejected) as err:
                await client.start_probe("p-1", "sdb")
            return err.value
        finally:
            await server.stop(None)

    rejected = asyncio.run(scenario())
    assert "StartProbe is not implemented by this agent (older version?)" in str(rejected)
    assert rejected.code == "UNIMPLEMENTED" and not rejected.retryable
