"""`sparkstack ship`: only what a host lacks crosses the wire, verified on arrival, resumable, to N hosts.

`local.py` reads what the head has (an image's blobs, cache entries, the targets), `plan.py` decides per
host what goes from one inventory round trip (pure), `wire.py` speaks to the stdlib-only `helper.py`
that runs on each host over ssh, `apply.py` moves the bytes and finishes each host.
"""

from sparkstack.ship.apply import ShipResult, apply_ship, apply_ship_recorded, plan_deployment_ship, plan_with_probe
from sparkstack.ship.local import entries_to_ship, remember_image, resolve_image
from sparkstack.ship.plan import ShipPlan, Target, default_streams, plan_ship

__all__ = ["ShipPlan", "ShipResult", "Target", "apply_ship", "apply_ship_recorded", "default_streams",
           "entries_to_ship", "plan_deployment_ship", "plan_ship", "plan_with_probe", "remember_image", "resolve_image"]
