"""The asv dashboard offline: asv's pages pointed at vendored copies of the assets they load from CDNs
(`fleetbench asv-offline`).  The static checks run in `make test`; the browser check (a published
dashboard loaded in headless Chromium with every other host unreachable) in `make test-slow`."""
from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil

import pytest

from suite.cli.main import main
from suite.report.asv_offline import ASSETS, VENDOR, OfflineError, external_assets, make_offline


def _asv_www() -> str:
    import asv

    return os.path.join(os.path.dirname(asv.__file__), "www")


@pytest.fixture
def published(tmp_path):
    """asv's own page files, as `asv publish` copies them into html_dir."""
    html = tmp_path / "html"
    shutil.copytree(_asv_www(), html)
    return html


def test_every_cdn_asset_of_asvs_pages_is_vendored_and_the_pages_load_nothing_from_elsewhere(published, capsys):
    before = (published / "index.html").read_text()
    assert set(external_assets(before)) == set(ASSETS), "asv's CDN assets changed: update ASSETS and vendor/asv"
    assert main(["asv-offline", str(published)]) == 0
    said = capsys.readouterr().out
    assert "works offline" in said  # and how to open it (issue 46.5): served on loopback, not as a file
    assert f"python3 -m http.server --bind 127.0.0.1 --directory {published} 8080" in said
    assert "http://127.0.0.1:8080/" in said
    for page in published.glob("*.html"):
        html = page.read_text()
        assert external_assets(html) == [], page
        refs = re.findall(r"<script\b[^>]*?\bsrc=[\"']([^\"']+)[\"']", html) + re.findall(
            r"<link\b[^>]*?rel=[\"']stylesheet[\"'][^>]*?href=[\"']([^\"']+)[\"']", html)
        assert refs or page.name != "index.html"
        for ref in refs:
            assert (published / ref).is_file(), f"{page.name} loads {ref}, which is not there"
    assert "integrity=" not in (published / "index.html").read_text()  # dropped with the CDN address


def test_vendored_files_are_the_ones_asv_pins_where_it_gives_a_hash():
    """Subresource Integrity hashes from asv's page: where npm's file is the one the CDN serves, it must match."""
    html = open(os.path.join(_asv_www(), "index.html")).read()
    checked = 0
    for url, rel in ASSETS.items():
        m = re.search(re.escape(url) + r"\"[^>]*integrity=\"(sha\d+)-([^\"]+)\"", html)
        assert m, url
        if url.endswith(".min.js") and not rel.endswith(".min.js") or "stupidtable" in url:
            continue  # flot unminified (npm has no .min), stupidtable 1.1.3 for 1.0.1: see vendor/asv/README.md
        with open(os.path.join(VENDOR, rel), "rb") as fh:
            digest = base64.b64encode(hashlib.new(m.group(1), fh.read()).digest()).decode()
        assert digest == m.group(2), (url, rel)
        checked += 1
    assert checked == 5, checked  # jquery, orderBars, md5, bootstrap js and css


def test_a_page_still_loading_from_another_host_is_an_error_naming_it(published, capsys):
    page = published / "extra.html"
    page.write_text('<html><script src="https://cdn.example.org/x.js"></script>'
                    '<a href="https://github.com/airspeed-velocity/asv/">a link is fine</a></html>')
    with pytest.raises(OfflineError, match=r"extra.html: https://cdn.example.org/x.js"):
        make_offline(str(published))
    assert main(["asv-offline", str(published.parent / "nothing")]) == 2
    assert "no index.html" in capsys.readouterr().err


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium on this machine (apt-get install chromium): the browser check cannot run; the static "
                "checks above still ran")


@pytest.mark.statistical  # a browser and an asv pass: make test-slow
@pytest.mark.timeout(900)
def test_the_published_dashboard_draws_a_graph_with_every_other_host_unreachable(tmp_path):
    import functools
    import http.server
    import json
    import subprocess
    import sys
    import threading

    browser = _chromium()
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    for args in (["config", "user.email", "h@test"], ["config", "user.name", "offline test"],
                 ["commit", "-q", "--allow-empty", "-m", "one night"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    conf = json.load(open(os.path.join(repo_root, "asv.conf.json")))
    conf.update(repo=str(repo), benchmark_dir=os.path.join(repo_root, "bench_cases"),
                results_dir=str(tmp_path / "asv"), html_dir=str(tmp_path / "html"), env_dir=str(tmp_path / "env"),
                branches=["main"])
    cfg = tmp_path / "asv.conf.json"
    cfg.write_text(json.dumps(conf))
    env = dict(os.environ, HOME=str(tmp_path), FLEETBENCH_BENCH_CASES="mlp/plain", FLEETBENCH_BENCH_WORLDS="2",
               FLEETBENCH_BENCH_ROUNDS="3", FLEETBENCH_BENCH_STEPS="2", FLEETBENCH_BENCH_SIZE="tiny")
    asv = os.path.join(os.path.dirname(sys.executable), "asv")
    for args in (["machine", "--machine", "cpu-test", "--yes"],
                 ["run", "-E", "existing:same", "--set-commit-hash", commit, "--machine", "cpu-test",
                  "--launch-method", "spawn", "--record-samples"],
                 ["publish"]):
        p = subprocess.run([asv, *args, "--config", str(cfg)], cwd=repo_root, env=env, capture_output=True,
                           text=True, timeout=600)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    html = tmp_path / "html"
    make_offline(str(html))

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/#asv_cases.StepTime.time_step"
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--host-resolver-rules=MAP * ~NOTFOUND, "
                 "EXCLUDE 127.0.0.1", "--virtual-time-budget=20000", "--window-size=1200,800"]
        dom = subprocess.run([browser, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
        shot = tmp_path / "asv-offline.png"
        subprocess.run([browser, *flags, f"--screenshot={shot}", url], capture_output=True, timeout=120)
    finally:
        server.shutdown()
    assert "continental origin of swallow" not in dom.stdout, "the page could not load its scripts"
    assert 'class="flot-base"' in dom.stdout, dom.stdout[-3000:]  # flot drew the graph's canvas
    assert shot.is_file() and shot.stat().st_size > 10_000
    if os.environ.get("FLEETBENCH_SAVE_SCREENSHOT"):
        shutil.copy(shot, os.environ["FLEETBENCH_SAVE_SCREENSHOT"])
