"""What `fetch` would do: the recipe's repos, the commit each pins, and what the head's hub lacks of it.

Reads the recipe and the hub cache; asks the hub (read-only) for a commit's file list only when no
earlier fetch recorded it, and for a repo's current commit only under --resolve.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkstack.deploy import Deployment
from sparkstack.errors import SparkstackError
from sparkstack.fetch import hub
from sparkstack.hfcache import (
    ListedFile,
    entry_name,
    read_listing,
    read_ref,
    refuse_unlisted,
    snapshot_needs,
)
from sparkstack.recipe import Recipe, copy_and_rerun, refuse_installed_recipe
from sparkstack.text import printable
from sparkstack.units import human_bytes

RESOLVE = ("sparkstack", "fetch", "--resolve")  # the command that pins a recipe's revisions, without its --recipe


@dataclass(frozen=True)
class Wanted:
    """One repo the recipe names, and the commit it pins (None while it says unpinned)."""

    label: str  # "model" or "drafter"
    field: str  # where the recipe keeps the revision
    repo: str
    revision: str | None


def wanted(recipe: Recipe) -> tuple[Wanted, ...]:
    out = [Wanted("model", "model_revision", recipe.model, recipe.model_pin)]
    if recipe.drafter_repo:
        out.append(Wanted("drafter", "[drafter] revision", recipe.drafter_repo, recipe.drafter_pin))
    return tuple(out)


@dataclass(frozen=True)
class ResolvePlan:
    recipe: Recipe
    pins: tuple[tuple[Wanted, str | None], ...]  # (entry, the hub's current commit; None when already pinned)

    @property
    def up_to_date(self) -> bool:
        return all(commit is None for _, commit in self.pins)

    def commit_for(self, label: str) -> str | None:
        return next((commit for w, commit in self.pins if w.label == label), None)

    def to_json(self) -> dict:
        return {"recipe": str(self.recipe.path), "up_to_date": self.up_to_date,
                "entries": [{"label": w.label, "repo": w.repo, "field": w.field, "pinned": w.revision,
                             "resolved": commit} for w, commit in self.pins]}


def plan_resolve(recipe: Recipe) -> ResolvePlan:
    """Ask the hub for the current commit of every unpinned repo; a pinned one is left as it is."""
    todo = wanted(recipe)
    if any(w.revision is None for w in todo):
        refuse_installed_recipe(recipe, RESOLVE)  # before asking the hub anything: the answer could not be written
    return ResolvePlan(recipe, tuple((w, None if w.revision else hub.current_commit(w.repo)) for w in todo))


@dataclass(frozen=True)
class EntryFetch:
    wanted: Wanted
    entry: Path  # hub/models--ORG--NAME
    files: tuple[ListedFile, ...]  # the commit's files, as the hub lists them
    listing_from: str  # "record" (an earlier fetch published it) or "hub"
    present: tuple[ListedFile, ...]
    to_link: tuple[ListedFile, ...]  # their blobs are in the entry already (another revision shares them)
    to_download: tuple[ListedFile, ...]
    ref_main: str | None

    @property
    def revision(self) -> str:
        assert self.wanted.revision is not None
        return self.wanted.revision

    @property
    def up_to_date(self) -> bool:
        return not self.to_link and not self.to_download and self.ref_main == self.revision

    @property
    def bytes_to_download(self) -> int:
        return sum(f.size for f in self.to_download)

    def to_json(self) -> dict:
        return {"label": self.wanted.label, "repo": self.wanted.repo, "revision": self.revision,
                "entry": str(self.entry), "up_to_date": self.up_to_date, "listing_from": self.listing_from,
                "files": len(self.files), "present": len(self.present), "to_link": [f.relpath for f in self.to_link],
                "to_download": [f.to_json() for f in self.to_download], "bytes_to_download": self.bytes_to_download,
                "ref_main": self.ref_main}


@dataclass(frozen=True)
class FetchPlan:
    recipe: Recipe
    hub: Path
    entries: tuple[EntryFetch, ...]
    warnings: tuple[str, ...] = ()

    @property
    def bytes_to_download(self) -> int:
        return sum(e.bytes_to_download for e in self.entries)

    def to_json(self) -> dict:
        return {"recipe": str(self.recipe.path), "hub": str(self.hub), "warnings": list(self.warnings),
                "licence": licence_of(self.recipe), "entries": [e.to_json() for e in self.entries]}


def licence_of(recipe: Recipe) -> dict | None:
    """The drafter's licence as the recipe records it (None when the recipe names no drafter repo)."""
    if not recipe.drafter_repo:
        return None
    return {"repo": recipe.drafter_repo, "licence": recipe.drafter_licence}


def licence_lines(recipe: Recipe) -> list[str]:
    """What a user must read before the drafter is downloaded: its licence, or that the recipe records none."""
    lic = licence_of(recipe)
    if lic is None:
        return []
    said = lic["licence"] or "not recorded in the recipe ([drafter] licence): read its model card before use"
    return [f"licence: drafter {lic['repo']}: {said}"]


def entry_state(w: Wanted, hub_dir: Path) -> EntryFetch:
    """What the hub cache holds of one pinned commit (the file list from the record, else from the hub)."""
    entry = hub_dir / entry_name(w.repo)
    files, source = read_listing(entry, w.revision), "record"
    if files is None:
        files, source = hub.listing(w.repo, w.revision), "hub"
    try:
        ref = read_ref(entry)
    except SparkstackError:
        ref = None  # unreadable: fetch writes a good one
    state = EntryFetch(w, entry, files, source, *snapshot_needs(entry, w.revision, files), ref_main=ref)
    if not state.up_to_date:
        refuse_unlisted(entry, w.revision, files, w.repo)  # before any download: publishing would drop it
    return state


def pin_steps(recipe: Recipe) -> str:
    """The command line that pins a recipe's revisions: on the recipe itself, or, for one installed with
    sparkstack (never edited in place), on a copy made first."""
    from sparkstack.shipped import installed_copy_root

    if installed_copy_root(recipe.path) is None:
        return shlex.join([*RESOLVE, "--recipe", printable(recipe.path)])  # pasted into a shell: quoted
    return copy_and_rerun(recipe.path, RESOLVE)


def plan_fetch(deployment: Deployment, environ: Mapping[str, str]) -> FetchPlan:
    """What the head's hub (the one launch mounts: the deployment's $HF_HOME/hub) lacks of the pinned commits;
    `environ` for HF_HUB_CACHE, which fetch does not follow."""
    recipe = deployment.recipe
    todo = wanted(recipe)
    unpinned = [w.field for w in todo if w.revision is None]
    if unpinned:
        raise SparkstackError(f"{printable(recipe.path)}: {' and '.join(unpinned)} unpinned: fetch downloads pinned "
                              f"commits only; run `{pin_steps(recipe)}` to pin the hub's current ones")
    hub_dir = deployment.local_hub
    warnings = []
    other = environ.get("HF_HUB_CACHE")
    if other and Path(os.path.expanduser(other)).absolute() != hub_dir.absolute():
        warnings.append(f"HF_HUB_CACHE={other} is ignored: fetch writes to {hub_dir}, the hub launch mounts")
    return FetchPlan(recipe, hub_dir, tuple(entry_state(w, hub_dir) for w in todo), tuple(warnings))


def resolve_lines(rplan: ResolvePlan, dry_run: bool, written: bool) -> list[str]:
    """The human form of `fetch --resolve`: each repo's pin, then what was written."""
    lines = []
    for w, commit in rplan.pins:
        lines.append(f"{w.label} {w.repo}: " + (f"pinned at {w.revision}, left as it is" if commit is None else
                                                f"{'would pin' if dry_run else 'pinned'} {w.field} = {commit}"))
    if written:
        lines.append(f"wrote {rplan.recipe.path}; now `sparkstack fetch --recipe {rplan.recipe.path}` downloads it")
    elif rplan.up_to_date:
        lines.append(f"up to date: every repo of {rplan.recipe.path} is pinned")
    return lines


def plan_lines(plan: FetchPlan) -> list[str]:
    """The human form of a fetch plan (`fetch --dry-run`)."""
    lines = licence_lines(plan.recipe)
    for e in plan.entries:
        head = f"{e.wanted.label} {e.wanted.repo} @ {e.revision}"
        if e.up_to_date:
            lines.append(f"{head}: up to date ({len(e.files)} files in {e.entry})")
            continue
        lines.append(f"{head}: would download {len(e.to_download)} files ({human_bytes(e.bytes_to_download)}), "
                     f"link {len(e.to_link)} held already, {len(e.present)} present; refs/main -> {e.revision[:12]} "
                     f"(file list from {'the last fetch' if e.listing_from == 'record' else 'the hub'})")
        for f in e.to_download:
            lines.append(f"  {f.relpath}  {human_bytes(f.size)}")
    return lines
