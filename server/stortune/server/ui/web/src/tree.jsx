// A host's storage as a tree, the way lsblk draws it: controllers, then each disk with its
// partitions and whatever is built on them (md, dm: LVM, multipath, crypt). A device held
// by several (an md array over four partitions) is drawn whole under the first and named
// under the others.
import { bytes } from './format.js';

function controllerOf(device) {
  const host = device.scsi_host;
  if (host) {
    const pci = host.pci && host.pci.address ? ` at PCI ${host.pci.address}` : '';
    const fc = host.fc_speed ? `, FC ${host.fc_speed}${host.fc_port_state ? ` ${host.fc_port_state}` : ''}` : '';
    return `${host.name} ${host.driver || ''}${pci}${fc}`.replace(/\s+/g, ' ').trim();
  }
  if (device.kind === 'loop') return 'loop devices';
  if (device.driver) return `${device.driver} devices`;
  return `${device.kind} devices`;
}

function facts(device) {
  const out = [device.kind];
  if (device.size_bytes) out.push(bytes(device.size_bytes));
  if (device.md && device.md.level) out.push(`${device.md.level}${device.md.chunk_bytes ? ` chunk ${bytes(device.md.chunk_bytes)}` : ''}`);
  if (device.dm && device.dm.type) out.push(device.dm.type + (device.dm.vg ? ` ${device.dm.vg}/${device.dm.lv}` : ''));
  if (device.rotational === true) out.push(device.rotation_rpm ? `${device.rotation_rpm} rpm` : 'rotational');
  if (device.rotational === false && device.kind === 'disk') out.push('non-rotating');
  if (device.link_rate) out.push(device.link_rate);
  for (const m of device.mounts || []) out.push(`${m.mountpoint} (${m.fstype})`);
  return out.join(' · ');
}

function Node({ device, byName, drawn, checks }) {
  const first = !drawn.has(device.name);
  drawn.add(device.name);
  const children = first ? [...(device.partitions || []), ...(device.holders || [])].filter((n) => byName.has(n)) : [];
  const mine = checks.filter((c) => c.device === device.name);
  const label = (
    <span class="node" data-device={device.name}>
      <strong>{device.name}</strong>
      {device.model && <span class="model">{device.model}</span>}
      <span class="muted">{facts(device)}</span>
      {(device.roles || []).map((r) => <span class="label role" key={r}>{r}</span>)}
      {mine.map((c, i) => (
        <span key={i} class={`warn warn-${c.severity}`} title={c.message}>{c.code}</span>
      ))}
      {!first && <span class="muted"> (drawn above)</span>}
    </span>
  );
  if (!children.length) return <li>{label}</li>;
  return (
    <li>
      <details open>
        <summary>{label}</summary>
        <ul>
          {children.map((n) => <Node key={n} device={byName.get(n)} byName={byName} drawn={drawn} checks={checks} />)}
        </ul>
      </details>
    </li>
  );
}

export function TopologyTree({ topology, checks }) {
  const devices = topology.devices || [];
  const byName = new Map(devices.map((d) => [d.name, d]));
  // Roots: nothing beneath them (no parent disk, no slaves)
  const roots = devices.filter((d) => !d.parent && !(d.slaves || []).length);
  const groups = new Map();
  for (const d of roots) {
    const key = controllerOf(d);
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(d);
  }
  const drawn = new Set();
  return (
    <ul class="tree" aria-label="Storage topology">
      {[...groups.entries()].map(([controller, disks]) => (
        <li key={controller}>
          <details open>
            <summary><span class="controller">{controller}</span></summary>
            <ul>
              {disks.map((d) => <Node key={d.name} device={d} byName={byName} drawn={drawn} checks={checks} />)}
            </ul>
          </details>
        </li>
      ))}
    </ul>
  );
}
