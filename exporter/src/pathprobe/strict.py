"""What every config model shares: strict models (an unknown key is an error) and the typed
quantities their fields take (rates, sizes with units, DSCP marks)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from .units import parse_quantity

Protocol = Literal["tcp", "udp"]
Direction = Literal["send", "receive"]
Congestion = Literal["cubic", "bbr", "reno"]

BitsPerSecond = Annotated[float, BeforeValidator(lambda v: parse_quantity(v, "rate")), Field(gt=0)]
Bytes = Annotated[int, BeforeValidator(lambda v: int(parse_quantity(v, "size"))), Field(ge=0)]
# The DSCP a probe class marks its packets with (the IP header's six high TOS bits). 0 (CS0, best
# effort) by default, so that probes are treated as the traffic they stand for: a probe marked
# higher than that traffic can look clean while the traffic loses packets.
Dscp = Annotated[int, Field(ge=0, le=63)]


def default(model: type[BaseModel], name: str) -> Any:
    """A field's default value: the one source that the CLI, the lab and the docs take it from."""
    return model.model_fields[name].default


class Strict(BaseModel):
    # allow_inf_nan: `.inf` or `.nan` in any float field is an error, not a schedule that never ends.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
