"""The one attention-backend selection algorithm, used for every platform.

`select_backend(cfg, backend=None)`:

1. The requested name is ``backend`` if given, else ``OpcoreConfig.attention.backend``
   (which ``OPCORE_ATTENTION_BACKEND`` sets). A requested backend is validated and used,
   or the call fails with its reasons: an explicit choice is never silently replaced.
2. Otherwise the current platform's ``get_attn_backend_candidates(cfg)`` are validated in
   order and the first valid one is used.
3. When none is valid the error lists every candidate with its reasons.

Each name is turned into a class by the registry (`registry.backend_class_path`), the
one route from a name to a class. Before selecting for the current platform, its
``import_kernels`` hook and the general plugins are run
(`opcore.platforms.kernels.ensure_kernels_loaded`, once per process), so every
`register_backend` call a plugin makes there is in effect.
For another platform object (tests, tools) the registry is taken as it stands, after the
general plugins.
The choice and every rejected candidate are logged on the ``opcore.attention`` logger and
recorded; `selection_info()` returns the records as plain data for `opcore info`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import TYPE_CHECKING, Any

from opcore.attention import registry
from opcore.attention.selector_config import AttentionSelectorConfig

if TYPE_CHECKING:
    from opcore.attention.backend import AttentionBackend

logger = logging.getLogger("opcore.attention")


class AttentionSelectionError(ValueError):
    """No backend can serve the configuration (or the explicit one cannot). ``selection``
    is the failed `Selection`, with every candidate's reasons."""

    def __init__(self, message: str, selection: Selection | None = None) -> None:
        super().__init__(message)
        self.selection = selection


@dataclasses.dataclass
class CandidateResult:
    name: str
    class_path: str | None
    reasons: list[str]

    @property
    def valid(self) -> bool:
        return not self.reasons


@dataclasses.dataclass
class Selection:
    """The outcome of one selection: the chosen backend and everything that was tried."""

    config: AttentionSelectorConfig
    platform: str
    source: str  # "argument", "config" or "platform"
    requested: str | None
    selected: str | None
    backend_cls: type[AttentionBackend] | None
    candidates: list[CandidateResult]
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.as_dict(),
            "platform": self.platform,
            "source": self.source,
            "requested": self.requested,
            "selected": self.selected,
            "class_path": (
                f"{self.backend_cls.__module__}.{self.backend_cls.__qualname__}"
                if self.backend_cls
                else None
            ),
            "candidates": [
                {
                    "name": c.name,
                    "class_path": c.class_path,
                    "valid": c.valid,
                    "reasons": list(c.reasons),
                }
                for c in self.candidates
            ],
            "error": self.error,
        }


_lock = threading.Lock()
_cache: dict[tuple, Selection] = {}
_records: dict[tuple, Selection] = {}


def load_registrations(platform: Any = None) -> None:
    """Make the registry complete for ``platform`` (default: the current one): the current
    platform's ``import_kernels`` and the general plugins run first, once per process; for
    any other platform object only the general plugins are loaded."""
    from opcore import platforms
    from opcore.plugins import load_general_plugins

    if platform is None or (
        platforms.is_resolved() and platforms.get_current_platform() is platform
    ):
        from opcore.platforms.kernels import ensure_kernels_loaded

        ensure_kernels_loaded()
    else:
        load_general_plugins()


def backend_class(name: str) -> type[AttentionBackend]:
    """The class registered for backend ``name``, with the current platform's registrations
    loaded first; no validation (`select_backend` validates). Raises
    `registry.UnknownBackendError` for a name nobody registered, ``ImportError`` /
    ``TypeError`` when the path does not lead to an `AttentionBackend` subclass."""
    load_registrations()
    return registry.load_backend_class(registry.backend_class_path(name))


def _evaluate(
    name: str, cfg: AttentionSelectorConfig
) -> tuple[CandidateResult, type[AttentionBackend] | None]:
    """Resolve and validate one name; every failure becomes a reason, never an exception."""
    try:
        path = registry.backend_class_path(name)
    except ValueError as exc:  # a name nobody registered
        return CandidateResult(name, None, [str(exc)]), None
    try:
        cls = registry.load_backend_class(path)
    except Exception as exc:  # a plugin's broken import must not hide the other candidates
        return CandidateResult(
            name, path, [f"cannot load {path}: {type(exc).__name__}: {exc}"]
        ), None
    try:
        reasons = list(cls.validate_configuration(cfg))
    except Exception as exc:
        reasons = [f"validate_configuration raised {type(exc).__name__}: {exc}"]
    return CandidateResult(name, path, reasons), (None if reasons else cls)


def _format_reasons(results: list[CandidateResult]) -> str:
    return "; ".join(f"{r.name}: [{', '.join(r.reasons)}]" for r in results)


def select_backend(
    cfg: AttentionSelectorConfig,
    backend: str | None = None,
    *,
    platform: Any = None,
    config: Any = None,
) -> Selection:
    """Choose the backend for ``cfg``; see the module docstring.

    Args:
        cfg: what the attention layer needs (head sizes, dtype, KV-cache layout).
        backend: a backend name to use instead of the config's or platform's choice.
        platform: the platform whose candidates are tried (default: the current one).
        config: the `opcore.config.OpcoreConfig` (default: the current one, `opcore.settings`).

    Returns:
        The `Selection`. Its ``.selected`` is the name, ``.backend_cls`` the class,
            ``.candidates`` every backend tried with its reasons.

    Raises:
        AttentionSelectionError: the requested backend, or every candidate, is invalid.
        registry.UnknownBackendError: a requested name is not registered.

    Examples:
        >>> import torch
        >>> from opcore.attention import AttentionSelectorConfig, select_backend
        >>> cfg = AttentionSelectorConfig(head_size=64, num_heads=8, num_kv_heads=8,
        ...                               dtype=torch.float32)
        >>> selection = select_backend(cfg, "torch_native")
        >>> selection.selected, selection.backend_cls.__name__
        ('TORCH_NATIVE', 'TorchNativeBackend')
    """
    from opcore import settings

    load_registrations(platform)
    if platform is None:
        from opcore.platforms import get_current_platform

        platform = get_current_platform()
    if config is None:
        config = settings.get_current_config()
    settings.check_pending_names(config, settings.ATTENTION_BACKENDS)
    if cfg.device_type is None:
        cfg = dataclasses.replace(cfg, device_type=platform.device_type or None)

    if backend is not None:
        requested, source = registry.normalize_name(backend), "argument"
    elif config.attention.backend:
        requested, source = registry.normalize_name(config.attention.backend), "config"
    else:
        requested, source = None, "platform"

    # The platform object itself is part of the key (not its id, which a later object
    # could reuse); an unhashable platform simply is not cached.
    full_key = (cfg, requested, platform, registry.registry_generation())
    key: tuple | None = full_key
    try:
        with _lock:
            hit = _cache.get(full_key)
    except TypeError:
        key, hit = None, None
    if hit is not None:
        return hit

    platform_name = getattr(platform, "name", type(platform).__name__)
    if requested is not None:
        if requested not in registry.known_names():
            registry.backend_class_path(requested)  # raises UnknownBackendError listing names
        result, cls = _evaluate(requested, cfg)
        selection = Selection(cfg, platform_name, source, requested, None, None, [result])
        if cls is None:
            origin = (
                "the backend argument"
                if source == "argument"
                else ("OpcoreConfig.attention.backend / OPCORE_ATTENTION_BACKEND")
            )
            selection.error = (
                f"Selected attention backend {requested} (from {origin}) is not valid for "
                f"{cfg!r} on platform {platform_name!r}: {'; '.join(result.reasons)}. An "
                "explicitly selected backend is never replaced; choose another or unset the "
                "selection."
            )
            _record(key, selection)
            logger.error("%s", selection.error)
            raise AttentionSelectionError(selection.error, selection)
        selection.selected, selection.backend_cls = requested, cls
    else:
        candidates = list(platform.get_attn_backend_candidates(cfg))
        results: list[CandidateResult] = []
        chosen = None
        for name in candidates:
            result, cls = _evaluate(registry.normalize_name(name), cfg)
            results.append(result)
            if cls is not None:
                chosen = (result.name, cls)
                break
        selection = Selection(cfg, platform_name, source, None, None, None, results)
        if chosen is None:
            if not candidates:
                selection.error = (
                    f"No attention backend candidates for {cfg!r}: platform {platform_name!r} "
                    "returned an empty get_attn_backend_candidates list"
                )
            else:
                selection.error = (
                    f"No valid attention backend for {cfg!r} on platform {platform_name!r}. "
                    f"Candidates and reasons: {_format_reasons(results)}"
                )
            _record(key, selection)
            logger.error("%s", selection.error)
            raise AttentionSelectionError(selection.error, selection)
        selection.selected, selection.backend_cls = chosen

    rejected = [r for r in selection.candidates if not r.valid]
    logger.info(
        "Using attention backend %s (%s) for %s on platform %s%s",
        selection.selected,
        {
            "argument": "explicit argument",
            "config": "explicit config",
            "platform": "platform candidate",
        }[source],
        cfg,
        platform_name,
        f"; rejected: {_format_reasons(rejected)}" if rejected else "",
    )
    _record(key, selection)
    if key is not None:
        with _lock:
            _cache[key] = selection
    return selection


def get_attn_backend(
    cfg: AttentionSelectorConfig, backend: str | None = None, **kwargs: Any
) -> type[AttentionBackend]:
    """`select_backend` returning the backend class only."""
    selection = select_backend(cfg, backend, **kwargs)
    assert selection.backend_cls is not None  # select_backend raises when none is valid
    return selection.backend_cls


def _record(key: tuple | None, selection: Selection) -> None:
    with _lock:
        _records[
            key if key is not None else (selection.config, selection.requested, len(_records))
        ] = selection


def selection_info() -> dict[str, Any]:
    """Plain data for `opcore info`: the registry (every name, its class path, and whether
    the core or a plugin registered it), complete for the current platform
    (`load_registrations`), and every selection made in this process (chosen backend,
    source, each candidate's reasons, or the error)."""
    load_registrations()
    with _lock:
        selections = [s.as_dict() for s in _records.values()]
    return {"registry": registry.registered_backends(), "selections": selections}


def clear_selection_records() -> None:
    """Forget recorded selections and cached results. The cache is keyed by everything a
    selection depends on and the records are the process's history for `opcore info`, so
    only tests reset them, through `opcore.testing.attention` (`opcore.attention` does not
    export it)."""
    with _lock:
        _records.clear()
        _cache.clear()


def probe_selection(cfg: AttentionSelectorConfig | None = None, **kwargs: Any) -> dict[str, Any]:
    """Run a selection for ``cfg`` (default: a Llama-style layer, 32 heads over 8 kv
    heads of size 128, block size 16, in the platform's preferred half-precision dtype)
    and return its record as plain data; an invalid selection is returned with its
    ``error`` instead of raised. For `opcore info` in a process that selected nothing."""
    import torch

    if cfg is None:
        from opcore.platforms import get_current_platform

        platform = kwargs.get("platform") or get_current_platform()
        dtypes = tuple(platform.supported_dtypes)
        dtype = next(
            (d for d in (torch.bfloat16, torch.float16) if d in dtypes),
            dtypes[0] if dtypes else torch.float32,
        )
        cfg = AttentionSelectorConfig(
            head_size=128, num_heads=32, num_kv_heads=8, dtype=dtype, block_size=16
        )
    try:
        return select_backend(cfg, **kwargs).as_dict()
    except AttentionSelectionError as exc:
        if exc.selection is not None:
            return exc.selection.as_dict()
        return {"config": cfg.as_dict(), "selected": None, "candidates": [], "error": str(exc)}
    except ValueError as exc:  # an unknown or malformed explicit backend name
        return {"config": cfg.as_dict(), "selected": None, "candidates": [], "error": str(exc)}
