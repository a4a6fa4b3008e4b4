"""What every adapter is, whatever areas it takes part in: its name, version, rank operations
and known defects (:class:`Adapter`), the answer for a case it cannot express
(:class:`Unsupported`), and what the areas' default methods share.

An area is a small base class of its own (``conformance/interface/<area>.py``), a subclass of
:class:`Adapter` naming itself in ``area``; an adapter subclasses the areas its library has.
Asked for a method of an area it does not subclass, an adapter answers :class:`Unsupported`
("takes no part in the ... area"), so the suite reports that area Unsupported, test by test.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, NoReturn

from shardspec.metadata import Layout

__all__ = ["AREA_METHODS", "AREA_TITLES", "Adapter", "KnownDefect", "Unsupported"]


class Unsupported(Exception):
    """The implementation under test cannot express or perform this case."""


@dataclass(frozen=True)
class KnownDefect:
    """A known defect of the implementation, declared by its adapter (``known_defects``):
    the test is a strict expected failure when that adapter is under test, and its failure
    must be a ``raises`` whose message ``match`` (a regular expression) is found in (CONF-14),
    exactly as a ``@pytest.mark.known_defect(name, reason, ...)`` mark in the suite."""

    reason: str
    raises: type[BaseException] | tuple[type[BaseException], ...]
    match: str
    issue: str | None = None

    def __post_init__(self) -> None:
        kinds = self.raises if isinstance(self.raises, tuple) else (self.raises,)
        exceptions = all(isinstance(k, type) and issubclass(k, BaseException) for k in kinds)
        if not kinds or not exceptions:
            raise TypeError(f"KnownDefect.raises must be exception types, got {self.raises!r}")
        if not isinstance(self.match, str) or not self.match.strip():
            raise TypeError(f"KnownDefect.match must be a non-empty pattern, got {self.match!r}")
        re.compile(self.match)  # a bad pattern fails where it is written


# Every area's methods, by name, and each area's one-line title: filled as the area classes
# are defined (conformance.interface imports them all), read when an adapter is asked for a
# method of an area it does not take part in.
AREA_METHODS: dict[str, str] = {}
AREA_TITLES: dict[str, str] = {}


class Adapter:
    """An implementation under test, taking part in no area yet: subclass it together with
    the areas your library has (``class Mine(Chunk, Reshard)``; an area class is an Adapter
    too, so ``class Mine(Chunk)`` is enough for one area).

    Layouts are :class:`shardspec.metadata.Layout`; placements are the JSON form
    (``["S", d]``, ``["R"]``, ``["SS", d, split_factor]``).
    """

    # How the report and "unsupported by <name>" name it; known_defect marks of the suite name
    # an adapter by it. An adapter that states none is named by its "module:Class".
    name = "?"
    # An area class states its name here (and its title in its docstring's first line).
    area: ClassVar[str | None] = None
    # Which code the suite's own rank operations run for this adapter (conformance/ops/):
    # "shardspec", "torch", or None when the implementation has none of its own there.
    via: str | None = None
    # Modules every pool rank imports, besides conformance.OPS, to register the named
    # operations this adapter runs there (shardspec.testing.ops.operation); a module that
    # registers its own on import lists itself: ``rank_ops = (__name__,)``.
    rank_ops: ClassVar[tuple[str, ...]] = ()
    # The implementation's known defects, by test: a test function's name (every
    # parametrization of it) or a node id pattern with "::" ("conformance/tests/
    # test_chunk.py::test_fsdp_*"), each a strict expected failure of its own failure.
    known_defects: ClassVar[Mapping[str, KnownDefect]] = MappingProxyType({})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        area = cls.__dict__.get("area")
        if area is None:
            return
        title = (cls.__doc__ or area).strip().splitlines()[0].rstrip(".")
        AREA_TITLES[area] = title[:1].lower() + title[1:]
        for attr, value in cls.__dict__.items():
            if callable(value) and not attr.startswith("_"):
                AREA_METHODS[attr] = area

    @classmethod
    def areas(cls) -> tuple[str, ...]:
        """The areas this adapter takes part in: the area classes it subclasses."""
        found = [k.__dict__["area"] for k in cls.__mro__ if k.__dict__.get("area")]
        return tuple(dict.fromkeys(found))

    def version(self) -> str:
        """The implementation's version (its package's), for the report's header."""
        return "unknown"

    def unsupported(self, what: str) -> Unsupported:
        return Unsupported(f"unsupported by {self.name}: {what}")

    def __getattr__(self, attr: str) -> Callable[..., NoReturn]:
        # Only reached for names the adapter lacks: a method of an area it does not subclass.
        area = AREA_METHODS.get(attr)
        if area is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")

        def refuse(*args: Any, **kwargs: Any) -> NoReturn:
            raise self.unsupported(
                f"the {area} area ({AREA_TITLES[area]}): {self.name} takes no part in it"
            )

        return refuse

    # What the areas' default methods share: running one of the suite's own rank operations
    # with this adapter's code (``via``), and a DCP save of a layout's boxes.
    def _run_via(
        self,
        what: str,
        pool: Any,
        op: str,
        args: dict[str, Any],
        *,
        taking_part: int | None = None,
        **kw: Any,
    ) -> Any:
        """``op`` on the pool ``via`` this adapter's code; ``taking_part``: how many of the
        pool's ranks the call runs on (default all), each of which must refuse for a
        conversion torch cannot make to count as Unsupported."""
        if self.via is None:
            raise self.unsupported(what)
        if getattr(pool, "single_program", False) and self.via != "torch":
            raise self.unsupported(
                f"{what} on one program for every rank (LocalTensorMode): {self.via} computes "
                "each rank's boxes from its rank number in Python; its large worlds run on "
                "threaded ranks (nox -s conformance_scale)"
            )
        from shardspec.testing import RankError
        from shardspec.testing.local_tensor import SingleProgramError

        try:
            return list(pool.run(op, {**args, "via": self.via}, **kw))
        except SingleProgramError as e:
            raise self.unsupported(f"{what} beyond LocalTensorMode's one program: {e}") from None
        except RankError as e:
            # Every rank refused to convert (CONVERT-5): a layout no torch type can hold, not
            # a wrong answer. Any other failure, or a refusal on some ranks only, stands.
            refusals = [f for f in e.failures if f.type_name.endswith("ConversionError")]
            taking = pool.world_size if taking_part is None else taking_part
            if refusals and len(refusals) == taking == len(e.failures):
                reason = e.failures[0].message
                raise self.unsupported(f"{what}: torch's types cannot hold it: {reason}") from None
            raise

    def _dcp_save(
        self,
        pool: Any,
        path: str,
        saved: Layout,
        tensor: Any,
        example: str,
        copies: int = 0,
        **extra: Any,
    ) -> None:
        """``checkpoint.save`` on the pool's ranks: ``saved``'s boxes of ``tensor`` (and
        ``extra`` arguments: ``values`` saved beside it) to ``path``; with ``copies`` k, also
        ``saved``'s boxes of ``tensor_copy(tensor, j)`` as ``t<j>``, j = 1..k."""
        from conformance.codec import layout_to_json

        args = {"path": path, "layout": layout_to_json(saved), "dtype": dtype_name(tensor),
                **extra}  # fmt: skip
        if copies:
            args["copies"] = copies
        every = [tensor] + [tensor_copy(tensor, j) for j in range(1, copies + 1)]
        inputs = [
            [x[b.slices()].contiguous() for x in every for b in saved.boxes_of(r)]
            for r in range(pool.world_size)
        ]
        self._run_via(
            "DCP save", pool, "checkpoint.save", args, per_rank_tensors=inputs, example=example
        )


def dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def tensor_copy(tensor: Any, j: int) -> Any:
    """Copy ``j`` >= 1 of ``tensor`` that a checkpoint holds beside it: ``tensor``'s elements
    rolled ``j`` places in row-major order, and each byte plus ``j`` (a bool flipped for odd
    ``j``). Of one geometry with ``tensor``, so a load may move them together, and unlike it
    and every other copy in every element of more than one byte, so what lands in the wrong
    tensor or place shows."""
    import torch

    # a fresh tensor: a view of one byte needs stride 1, which an empty or strided one may lack
    flat = torch.empty(tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    flat.copy_(tensor.detach().reshape(-1))
    if flat.numel():
        flat = torch.roll(flat, j)
    if tensor.dtype == torch.bool:
        flat = flat ^ bool(j % 2)
    else:
        raw = flat.contiguous().view(torch.uint8)
        flat = (raw + (j % 256)).view(tensor.dtype)
    return flat.reshape(tensor.shape).clone()


def ones_of(load: dict[str, Any], tensor: Any, world: int) -> list[list[Any]]:
    """Per rank, the local tensors a load into ``load`` starts from: ones, one per box of a
    ShardedTensor destination (the other kinds build their own)."""
    import torch

    from conformance.codec import layout_from_json

    if load["kind"] != "sharded":
        return [[] for _ in range(world)]
    dst = layout_from_json(load["layout"])
    ones = torch.ones((), dtype=tensor.dtype)
    return [[ones.expand(b.sizes).contiguous() for b in dst.boxes_of(r)] for r in range(world)]
