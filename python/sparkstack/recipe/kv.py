"""The KV planner: tokens a KV pin buys, how much of max-model-len it covers, and whether pages unify."""

from __future__ import annotations

from dataclasses import dataclass, replace

from sparkstack.recipe import KvGeometry

DRAFTER_FIT_MULTIPLE = 64  # the drafter-group patch needs a fit block that is a multiple of 64


@dataclass(frozen=True)
class PageCheck:
    ok: bool | None
    reason: str


@dataclass(frozen=True)
class KvPlan:
    kv_bytes: int | None
    per_token_bytes: float | None
    tokens: int | None
    max_model_len: int
    coverage: float | None
    page_unification: PageCheck

    def to_json(self) -> dict:
        return {
            "kv_bytes": self.kv_bytes, "per_token_bytes": self.per_token_bytes, "tokens": self.tokens,
            "max_model_len": self.max_model_len, "coverage": self.coverage,
            "page_unification": {"ok": self.page_unification.ok, "reason": self.page_unification.reason},
        }

    def lines(self) -> list[str]:
        """The human form (`plan kv`): the tokens the pool buys, then page unification."""
        if self.tokens is None:
            first = f"tokens: unknown ({'no KV bytes given' if self.kv_bytes is None else 'no measured per-token cost'})"
        else:
            first = (f"{self.kv_bytes:,} B / {self.per_token_bytes:,.2f} B per token = {self.tokens:,} tokens "
                     f"= {self.coverage:.2f}x max-model-len {self.max_model_len:,}")
        pu = self.page_unification
        return [first, f"page unification: {'ok' if pu.ok else 'unknown' if pu.ok is None else 'FAILS'}: {pu.reason}"]


def per_token_bytes(kv: KvGeometry) -> float | None:
    """The measured cost of one token of KV across the whole pool (all layers, both ranks' minimum)."""
    if kv.measured_bytes and kv.measured_tokens:
        return kv.measured_bytes / kv.measured_tokens
    return None


def for_dtype(kv: KvGeometry, kv_dtype: str | None) -> KvGeometry | None:
    """The geometry with the page figures of `kv_dtype` ([kv.pages.<dtype>]); None when the recipe gives figures per
    dtype but none for this one. A recipe without [kv.pages] keeps its flat figures for any dtype."""
    if not kv.pages or kv_dtype is None:
        return kv
    for dtype, mla, indexer in kv.pages:
        if dtype == kv_dtype:
            return replace(kv, mla_page_bytes_per_token=mla, indexer_page_bytes_per_token=indexer)
    return None


def _fits(mla_page: int, drafters: list[tuple[str, int]]) -> list[str] | None:
    """How the drafter rides an MLA page, per drafter KV dtype: None unless every one is an exact fit."""
    fits = []
    for label, d in drafters:
        fit, rem = divmod(mla_page, d)
        if rem or fit % DRAFTER_FIT_MULTIPLE:
            return None
        fits.append(f"{fit} x {d:,} B/token {label}")
    return fits


def page_unification(kv: KvGeometry, block_size: int, kv_dtype: str | None = None) -> PageCheck:
    """Can vLLM give every KV group one page size? It scales block sizes by integers, so it needs
    every per-token page to divide the largest one. The drafter-group patch takes the drafter out
    of that unification: it rides the MLA page on an exact fit, or gets standalone tensors.
    `kv_dtype` (the argv's --kv-cache-dtype) picks the page figures where the recipe gives them per dtype."""
    picked = for_dtype(kv, kv_dtype)
    if picked is None:
        return PageCheck(None, f"no page figures for --kv-cache-dtype {kv_dtype} (the recipe's [kv.pages] has "
                               f"{', '.join(d for d, _, _ in kv.pages)})")
    kv = picked
    mla, indexer, drafter = kv.mla_page_bytes_per_token, kv.indexer_page_bytes_per_token, kv.drafter_page_bytes_per_token
    if mla is None or drafter is None:
        return PageCheck(None, "geometry unknown")
    if kv.drafter_group_patch:
        base = [p for p in (mla, indexer) if p]
        largest = max(base)
        bad = [p for p in base if largest % p]
        if bad:
            return PageCheck(False, f"MLA/indexer pages do not unify: {largest} % {bad[0]} != 0")
        mla_page = mla * block_size
        drafters = [("bf16", drafter)] + ([("fp8", kv.drafter_page_bytes_per_token_fp8)]
                                          if kv.drafter_page_bytes_per_token_fp8 else [])
        fits = _fits(mla_page, drafters)
        if fits is not None:
            # The blog's words: the MLA page is an exact fit for the drafter's geometries, so the drafter rides it.
            of = f"{kv_dtype}, " if kv_dtype else ""
            both = "both drafter geometries" if len(fits) == 2 else "the drafter's geometry"
            return PageCheck(True, f"drafter-group patch: the MLA page of {mla_page:,} B ({of}{mla} B/token x block "
                                   f"{block_size}) is an exact fit for {both} ({'; '.join(fits)}): the drafter rides "
                                   "the MLA page")
        return PageCheck(True, f"drafter-group patch: the drafter gets standalone KV tensors "
                               f"(MLA page {mla_page} B / {drafter} B per token is not an exact multiple-of-{DRAFTER_FIT_MULTIPLE} fit)")
    failures = []
    for label, d in (("bf16", drafter), ("fp8", kv.drafter_page_bytes_per_token_fp8)):
        if not d:
            continue
        pages = [p for p in (mla, indexer, d) if p]
        largest = max(pages)
        failures += [f"drafter {label} {d} B: {largest} % {p} = {largest % p}" for p in pages if largest % p]
    if failures:
        return PageCheck(False, "per-token page sizes do not divide the largest (" + "; ".join(failures) + "): vLLM "
                                "fails with 'page size is not divisible by the maximum page size and cannot be padded'")
    return PageCheck(True, "every page divides the largest")


def plan_kv(kv: KvGeometry, kv_bytes: int | None, max_model_len: int, block_size: int,
            kv_dtype: str | None = None) -> KvPlan:
    cost = per_token_bytes(kv)
    # Integer arithmetic, so the measured point maps back to exactly its token count.
    tokens = kv_bytes * kv.measured_tokens // kv.measured_bytes if (cost and kv_bytes is not None) else None
    coverage = round(tokens / max_model_len, 3) if tokens is not None and max_model_len else None
    return KvPlan(kv_bytes, round(cost, 2) if cost else None, tokens, max_model_len, coverage,
                  page_unification(kv, block_size, kv_dtype))
