"""The state directory: $SPARKSTACK_STATE_DIR, else $XDG_STATE_HOME/sparkstack, else ~/.local/state/sparkstack."""

from pathlib import Path

from sparkstack.state import launch_runs_dir, state_root, up_record_path


def test_state_dir_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARKSTACK_STATE_DIR", str(tmp_path / "s"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "x"))
    assert state_root() == tmp_path / "s"
    assert launch_runs_dir() == tmp_path / "s" / "runs"
    assert up_record_path() == tmp_path / "s" / "up" / "last.json"


def test_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.delenv("SPARKSTACK_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "x"))
    assert state_root() == tmp_path / "x" / "sparkstack"
    monkeypatch.setenv("XDG_STATE_HOME", "")  # empty counts as unset, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state_root() == Path(tmp_path / "home" / ".local" / "state" / "sparkstack")
