"""Errors the converter raises for users: each names what failed and says what to try."""

from __future__ import annotations

from dataclasses import dataclass, field


class ConversionError(RuntimeError):
    """The model could not be converted (export failed, a lowering failed, the IR is
    malformed...). The message names the stage and the op or argument at fault."""


class ExportError(ConversionError):
    """`torch.export` could not capture the module (before any of our own stages ran)."""


@dataclass
class UnsupportedOp:
    """One ATen op with no lowering: how often it appears and where (user source lines)."""

    name: str
    count: int = 0
    sources: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # why a lowering refused this use


class UnsupportedOpsError(ConversionError):
    """Raised once after the whole graph was walked, listing EVERY op without a lowering,
    so a user sees the full gap in one run instead of one op per attempt."""

    def __init__(self, ops: list[UnsupportedOp]):
        self.ops = sorted(ops, key=lambda op: (-op.count, op.name))
        super().__init__(self._message())

    def _message(self) -> str:
        total = sum(op.count for op in self.ops)
        lines = [f"{len(self.ops)} ATen op(s) have no LiteRT lowering ({total} call(s) in the graph):"]
        for op in self.ops:
            lines.append(f"  - {op.name}  x{op.count}")
            for reason in list(dict.fromkeys(op.reasons))[:3]:
                lines.append(f"      why: {reason}")
            shown = list(dict.fromkeys(op.sources))
            for src in shown[:5]:
                lines.append(f"      at {src}")
            if len(shown) > 5:
                lines.append(f"      ... and {len(shown) - 5} more place(s)")
        lines.append(
            "What to do: rewrite those calls with supported ops, move them out of forward() "
            "(pre/post-processing), or add a lowering with @lowers(...) in "
            "converter/lowering/<family>.py."
        )
        return "\n".join(lines)
