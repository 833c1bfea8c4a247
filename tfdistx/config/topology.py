"""Cluster topologies named on the command line: `WxD` and `psPwW`.

Hydra finds a group option by looking for a config of that name, and no
directory can hold every `4x8`. So before composing, the names the user asked
for are parsed and stored in Hydra's ConfigStore as `cluster/<name>`: the
option then composes like any file, sweeps (`cluster=1x2,2x1`) included, and a
malformed name still gets Hydra's own "could not find" answer, which
validation rewords.
"""

import dataclasses
import re
from typing import Iterable, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser

from tfdistx.config.schema import ClusterConfig

_GRID = re.compile(r"^(\d+)x(\d+)$")  # workers x devices per worker
_PS = re.compile(r"^ps(\d+)w(\d+)$")  # parameter servers, workers

# The cluster keys a topology name does not set keep the schema's defaults
# (those of conf/cluster/local.yaml).
_PLACEMENT = {
    key: value
    for key, value in dataclasses.asdict(ClusterConfig()).items()
    if key not in ("name", "workers", "devices_per_worker", "ps")
}

FORMS = "local, WxD (W workers x D devices each, e.g. 1x4, 4x8) or psPwW (e.g. ps2w4)"


def parse(name: str) -> Optional[dict]:
    """The cluster config a topology name stands for, or None."""
    if m := _GRID.match(name):
        workers, devices = int(m[1]), int(m[2])
        return {"name": name, "workers": workers, "devices_per_worker": devices, "ps": 0, **_PLACEMENT}
    if m := _PS.match(name):
        return {"name": name, "workers": int(m[2]), "devices_per_worker": 1, "ps": int(m[1]), **_PLACEMENT}
    return None


def is_parameter_server_name(name: str) -> bool:
    return bool(_PS.match(str(name)))


def requested_names(overrides: Iterable[str], group: str = "cluster") -> list:
    """Every value given to `group=` in these overrides, sweeps included."""
    names = []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.key_or_group != group or override.value() is None:
            continue
        if override.is_sweep_override():
            names += [str(v) for v in override.sweep_string_iterator()]
        else:
            names.append(str(override.value()))
    return names


def register(overrides: Iterable[str]) -> None:
    store = ConfigStore.instance()
    for name in requested_names(overrides):
        node = parse(name)
        if node is not None:
            store.store(group="cluster", name=name, node=node)
