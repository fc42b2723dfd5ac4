"""Carry out `fetch`: pin commits into the recipe, or download exactly the pinned commits into the head's hub.

A download is staged as a cache entry of its own beside the entries ($HF_HOME/hub/.sparkstack-fetch/<commit>/),
so the entry itself only ever changes in `hfcache.publish_fetched`: after every downloaded blob has been hashed
against the name the hub lists for it. A killed fetch leaves its finished blobs staged; the next one finds them
there, hashes them again and goes on.
"""

from __future__ import annotations

import queue
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparkstack import fsio
from sparkstack.errors import SparkstackError
from sparkstack.fetch import hub
from sparkstack.fetch.plan import RESOLVE, EntryFetch, FetchPlan, ResolvePlan, entry_state
from sparkstack.hfcache import (
    ListedFile,
    blob_algorithm,
    blob_is_intact,
    blobs_dir,
    entry_name,
    publish_fetched,
)
from sparkstack.recipe import write_revisions
from sparkstack.units import human_bytes

STAGE = ".sparkstack-fetch"
MAX_STREAMS = 8  # files downloading at once, as huggingface_hub's snapshot_download does


def apply_resolve(plan: ResolvePlan) -> bool:
    """Write the resolved commits into the recipe; False when every repo was pinned already."""
    if plan.up_to_date:
        return False
    write_revisions(plan.recipe, plan.commit_for("model"), plan.commit_for("drafter"), RESOLVE)
    return True


@dataclass(frozen=True)
class EntryResult:
    label: str
    repo: str
    revision: str
    up_to_date: bool
    downloaded: int = 0
    bytes_downloaded: int = 0
    resumed: int = 0  # files a killed fetch had finished, found staged
    linked: int = 0

    def to_json(self) -> dict:
        return {"label": self.label, "repo": self.repo, "revision": self.revision, "up_to_date": self.up_to_date,
                "downloaded": self.downloaded, "bytes_downloaded": self.bytes_downloaded, "resumed": self.resumed,
                "linked": self.linked}


def apply_fetch(plan: FetchPlan, on_progress: Callable[[int], None] | None = None,
                on_wait: Callable[[Path, int | None], None] = lambda entry, pid: None) -> tuple[EntryResult, ...]:
    results = []
    for e in plan.entries:
        if e.up_to_date:
            results.append(EntryResult(e.wanted.label, e.wanted.repo, e.revision, True))
            continue
        with fsio.dest_lock(e.entry, on_wait):
            fresh = entry_state(e.wanted, plan.hub)  # another fetch may have published it while we waited
            if fresh.up_to_date:
                results.append(EntryResult(e.wanted.label, e.wanted.repo, e.revision, True))
                continue
            results.append(_fetch_entry(fresh, plan.hub, on_progress or (lambda n: None)))
    return tuple(results)


def _fetch_entry(e: EntryFetch, hub_dir: Path, on_progress: Callable[[int], None]) -> EntryResult:
    name = entry_name(e.wanted.repo)
    stage = hub_dir / STAGE / e.revision
    for old in (hub_dir / STAGE).glob(f"*/{name}"):
        if old.parent != stage:  # a killed fetch of another commit of this repo: nothing to resume there
            shutil.rmtree(old.parent, ignore_errors=True)
    staged_entry = stage / name
    blobs = blobs_dir(staged_entry)
    blobs.mkdir(parents=True, exist_ok=True)
    # What a killed run finished is kept if it still hashes to its name; anything else there goes again.
    resumed = [f for f in e.to_download if (blobs / f.blob).is_file() and _problem(blobs / f.blob, f) is None]
    on_progress(sum(f.size for f in resumed))
    fresh = [f for f in e.to_download if f not in resumed]

    def download(f: ListedFile) -> None:
        hub.download(e.wanted.repo, e.revision, f, blobs / f.blob, on_progress)
        problem = _problem(blobs / f.blob, f)  # hashed while the other streams still download
        if problem:
            raise SparkstackError(f"{e.wanted.repo}@{e.revision}: {f.relpath} {problem}; removed it, nothing "
                                  "published (run fetch again)")

    _download_all(sorted(fresh, key=lambda f: -f.size), download)
    publish_fetched(staged_entry, e.entry, e.revision, e.files, e.wanted.repo)
    shutil.rmtree(stage, ignore_errors=True)
    try:
        (hub_dir / STAGE).rmdir()
    except OSError:
        pass  # another commit's fetch is staged there
    return EntryResult(e.wanted.label, e.wanted.repo, e.revision, False, len(fresh),
                       sum(f.size for f in fresh), len(resumed), len(e.to_link))


def _download_all(files: list[ListedFile], download: Callable[[ListedFile], object]) -> None:
    """Up to MAX_STREAMS files at once. After a failure no new file starts, and the first failure is raised once
    the running ones end (what finished stays staged). Daemon threads: Ctrl-C stops the whole fetch at once."""
    todo, failures = queue.SimpleQueue(), []
    for f in files:
        todo.put(f)

    def worker() -> None:
        while not failures:
            try:
                f = todo.get_nowait()
            except queue.Empty:
                return
            try:
                download(f)
            except Exception as exc:  # noqa: BLE001 -- any failure is handed to the main thread, which raises it
                failures.append(exc)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(MAX_STREAMS, len(files)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]


def _problem(blob: Path, f: ListedFile) -> str | None:
    """None when the staged blob is of the listed size and its bytes hash to its name; a blob that fails
    here is removed from the stage."""
    problem = None
    if not blob.is_file():
        problem = "is missing from the stage"
    elif blob.stat().st_size != f.size:
        problem = f"is {blob.stat().st_size} bytes, not the {f.size} the hub lists"
    elif not blob_is_intact(blob, f.blob):
        problem = f"does not hash to its {blob_algorithm(f.blob)} {f.blob}"
    if problem:
        blob.unlink(missing_ok=True)
    return problem


def result_lines(plan: FetchPlan, results: list[EntryResult]) -> list[str]:
    """The human form of what a fetch did, one line per entry."""
    lines = []
    for r, e in zip(results, plan.entries):
        head = f"{r.label} {r.repo} @ {r.revision}"
        if r.up_to_date:
            lines.append(f"{head}: up to date ({e.entry})")
        else:
            lines.append(f"{head}: downloaded {r.downloaded} files ({human_bytes(r.bytes_downloaded)})"
                         + (f", {r.resumed} finished by an earlier run" if r.resumed else "")
                         + f", linked {r.linked}; {e.entry} refs/main -> {r.revision[:12]}")
    return lines
