"""The web console (`GET /_sluice/console`) in a real headless Chromium
(Debian's chromium and chromedriver, driven by Selenium): indices with their
counts and sizes, an index's fields and documents, the query box, the charts
of the last ten minutes, and the near-data demo, each checked against what
the API answers. Every test keeps a screenshot under
target/test-artifacts/console/ (or $SLUICE_TEST_ARTIFACTS/console/)."""

import json
import os
import re
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis
from conftest import SluiceServe, _target_dir, run_cli


from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

ARTIFACTS = Path(os.environ.get("SLUICE_TEST_ARTIFACTS", _target_dir() / "test-artifacts")) / "console"


def call(url, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def post(url, path, body):
    return call(url, "POST", path, body)


def get(url, path):
    return call(url, "GET", path)


BOOKS_MAPPING = {"properties": {
    "title": {"type": "text"},
    "year": {"type": "integer"},
    "meta": {"properties": {"pages": {"type": "integer"}, "publisher": {"type": "keyword"}}},
}}


@pytest.fixture(scope="module")
def papers_server(tmp_path_factory, sluice_bin):
    dev = tmp_path_factory.mktemp("console") / "papers.dev"
    run_cli(sluice_bin, "kv", "--device", str(dev), "format", "--create-mib", "256")
    run_cli(sluice_bin, "papers", "--device", str(dev), "generate", "--papers", "3000", "--seed", "7")
    server = SluiceServe(sluice_bin, dev)
    call(server.url, "PUT", "/books", {"mappings": BOOKS_MAPPING})
    lines = []
    for i in range(12):
        lines.append(json.dumps({"index": {"_index": "books", "_id": f"b{i:02}"}}))
        lines.append(json.dumps({"title": f"book {i}", "year": 2000 + i,
                                 "meta": {"pages": 100 + i, "publisher": "p" + str(i % 3)}}))
    req = urllib.request.Request(server.url + "/_bulk?refresh=true", data=("\n".join(lines) + "\n").encode(),
                                 method="POST", headers={"Content-Type": "application/x-ndjson"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(r.read())["errors"] is False
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser():
    assert shutil.which("chromium") and shutil.which("chromedriver"), "scripts/setup installs chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1800"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def text(driver, element_id):
    return driver.find_element(By.ID, element_id).text


def open_console(browser, url):
    browser.get_log("browser")  # what earlier pages logged is theirs
    browser.get(url + "/_sluice/console")


def keep_screenshot(browser, name):
    """Keeps the page as the test left it: a PNG a person can look at."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    assert browser.save_screenshot(str(path))
    assert path.stat().st_size > 10_000, f"{path} is too small to hold the page"


def script_errors(browser, allowed=()):
    """The page's severe log lines, but for the failed requests a test
    made on purpose (a browser logs every 4xx answer)."""
    return [e for e in browser.get_log("browser")
            if e["level"] == "SEVERE" and not any(a in e["message"] for a in allowed)]


def test_the_demo_runs_from_clicks_and_shows_the_api_numbers(papers_server, browser):
    url = papers_server.url
    open_console(browser, url)
    wait = WebDriverWait(browser, 60)
    wait.until(lambda d: len(Select(d.find_element(By.ID, "venue")).options) > 0)
    wait.until(lambda d: len(Select(d.find_element(By.ID, "year")).options) > 0)
    assert not browser.find_element(By.ID, "demo-missing").is_displayed()
    venues = [o.get_attribute("value") for o in Select(browser.find_element(By.ID, "venue")).options]
    want_venues = [r["venue"] for r in post(url, "/_sluice/query", {"keyspace": "papers", "aggregate": "count(*)", "group_by": "venue"})["rows"]]
    assert venues == want_venues
    Select(browser.find_element(By.ID, "venue")).select_by_value(venues[1])
    wait.until(lambda d: d.find_element(By.ID, "run").is_enabled())
    year_select = Select(browser.find_element(By.ID, "year"))
    wait.until(lambda d: len(Select(d.find_element(By.ID, "year")).options) > 0)
    year = int(year_select.options[0].get_attribute("value"))
    browser.find_element(By.ID, "run").click()
    wait.until(lambda d: text(d, "status") == "done")
    want = post(url, "/_sluice/demo", {"venue": venues[1], "year": year})
    assert int(text(browser, "candidates")) == want["candidates"] > 0
    assert int(text(browser, "graph-vertices")) == want["graph"]["vertices"]
    assert int(text(browser, "graph-edges")) == want["graph"]["edges"]
    if want["central"]:
        assert int(text(browser, "central-id")) == want["central"]["id"]
        assert text(browser, "central-title") == want["central"]["paper"]["title"]
    shown = [li.get_attribute("data-id") for li in browser.find_elements(By.CSS_SELECTOR, "#same-venue-year li")]
    assert shown == [str(p["id"]) for p in want["same_venue_year"]]
    # The same data, handed over: the byte counts do not depend on timing.
    assert int(text(browser, "engine-bytes")) == want["engine"]["bytes_handed_over"]
    assert int(text(browser, "block-bytes")) == want["block_stack"]["bytes_handed_over"]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart rect")) == 2
    browser.execute_script("document.getElementById('demo').scrollIntoView()")
    keep_screenshot(browser, "demo")
    assert script_errors(browser) == []


def flatten(properties, prefix=""):
    out = []
    for name, field in properties.items():
        path = f"{prefix}.{name}" if prefix else name
        if "properties" in field:
            out += flatten(field["properties"], path)
        else:
            out.append((path, field["type"]))
    return out


def test_indices_their_fields_and_documents_are_shown(papers_server, browser):
    url = papers_server.url
    open_console(browser, url)
    wait = WebDriverWait(browser, 30)
    row = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#indices-table tr[data-index='books']"))
    cat = {i["index"]: i for i in get(url, "/_cat/indices?format=json&bytes=b")}
    assert row.get_attribute("data-docs") == cat["books"]["docs.count"] == "12"
    # The user's keyspaces are listed; the API's and Redis's own are not.
    keyspaces = [tr.get_attribute("data-keyspace") for tr in browser.find_elements(By.CSS_SELECTOR, "#keyspaces-table tbody tr")]
    assert {"papers", "authors", "venues", "refs"} <= set(keyspaces)
    assert not [k for k in keyspaces if k.startswith(("http.", "redis."))]
    row.click()
    wait.until(lambda d: d.find_element(By.ID, "detail-body").is_displayed())
    fields = [(tr.find_element(By.CSS_SELECTOR, "td:nth-child(1)").text, tr.find_element(By.CSS_SELECTOR, "td:nth-child(2)").text)
              for tr in browser.find_elements(By.CSS_SELECTOR, "#fields tbody tr")]
    mapping = get(url, "/books/_mapping")["books"]["mappings"]["properties"]
    assert sorted(fields) == sorted(flatten(mapping))
    assert ("meta.pages", "integer") in fields
    docs = [tr.get_attribute("data-id") for tr in browser.find_elements(By.CSS_SELECTOR, "#docs tbody tr")]
    want = post(url, "/books/_search", {"size": 5, "query": {"match_all": {}}})["hits"]["hits"]
    assert docs == [h["_id"] for h in want] and len(docs) == 5
    first_source = browser.find_element(By.CSS_SELECTOR, "#docs tbody tr td:nth-child(2)").get_attribute("textContent")
    assert json.loads(first_source) == want[0]["_source"]
    assert text(browser, "docs-shown") == "5 of 12"
    keep_screenshot(browser, "index")
    assert script_errors(browser) == []


def run_query(browser, target, mode, query):
    Select(browser.find_element(By.ID, "target")).select_by_value(target)
    browser.find_element(By.ID, "mode-" + mode).click()
    box = browser.find_element(By.ID, "query-text")
    box.clear()
    box.send_keys(query)
    browser.execute_script("document.getElementById('query-status').dataset.rows = ''")
    browser.find_element(By.ID, "query-run").click()
    WebDriverWait(browser, 60).until(
        lambda d: d.execute_script("return document.getElementById('query-status').dataset.rows")
        or text(d, "query-error"))
    return [tr.get_attribute("data-id") for tr in browser.find_elements(By.CSS_SELECTOR, "#query-result tbody tr")]


def test_the_query_box_runs_the_dsl_and_predicates(papers_server, browser):
    url = papers_server.url
    open_console(browser, url)
    wait = WebDriverWait(browser, 30)
    wait.until(lambda d: len(Select(d.find_element(By.ID, "target")).options) > 0)
    dsl = {"query": {"range": {"year": {"gte": 2005}}}, "size": 50}
    ids = run_query(browser, "index:books", "dsl", json.dumps(dsl))
    want = post(url, "/books/_search", dsl)["hits"]["hits"]
    assert ids == [h["_id"] for h in want] and len(ids) == 7
    status = text(browser, "query-status")
    assert re.search(r"7 shown of 7 hits; \d+ ms in the server, [\d.]+ ms here", status), status
    headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#query-result thead th")]
    assert headers == ["_id", "title", "year", "meta"]

    ids = run_query(browser, "index:books", "predicate", "year >= 2005 and year < 2008")
    want = post(url, "/_sluice/query", {"index": "books", "where": "year >= 2005 and year < 2008", "limit": 100})["rows"]
    assert ids == [r["key"] for r in want] == ["b05", "b06", "b07"]

    ids = run_query(browser, "keyspace:papers", "predicate", "year = 2010")
    want = post(url, "/_sluice/query", {"keyspace": "papers", "where": "year = 2010", "limit": 100})
    assert ids == [r["key"] for r in want["rows"]] and ids
    assert f"of {want['stats']['rows_examined']} examined" in text(browser, "query-status")
    keep_screenshot(browser, "query")

    # Bad input: the page says what was wrong, from the browser or the server.
    run_query(browser, "index:books", "dsl", '{"query": ')
    assert text(browser, "query-error").startswith("the query is not JSON")
    run_query(browser, "keyspace:papers", "dsl", "{}")
    assert "query keyspace papers with a predicate" in text(browser, "query-error")
    run_query(browser, "keyspace:papers", "predicate", "no_such_field = 1")
    error = text(browser, "query-error")
    assert "no_such_field" in error, error
    assert browser.find_elements(By.CSS_SELECTOR, "#query-result tbody tr") == []
    assert script_errors(browser, allowed=["status of 400"]) == []


def test_the_charts_draw_the_servers_last_minutes(papers_server, browser):
    url = papers_server.url
    # Something to draw: writes (the log, the device) and Redis commands.
    lines = []
    for i in range(300):
        lines.append(json.dumps({"index": {"_index": "logs", "_id": str(i)}}))
        lines.append(json.dumps({"message": "x" * 2000, "n": i}))
    req = urllib.request.Request(url + "/_bulk", data=("\n".join(lines) + "\n").encode(),
                                 method="POST", headers={"Content-Type": "application/x-ndjson"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(r.read())["errors"] is False
    port = int(re.search(r"Redis protocol .* on 127\.0\.0\.1:(\d+)", "".join(papers_server.banner)).group(1))
    client = redis.Redis(port=port)
    for i in range(200):
        client.set(f"k{i}", "v")
    client.close()
    open_console(browser, url)
    wait = WebDriverWait(browser, 60)
    wait.until(lambda d: int(d.find_element(By.ID, "updated").get_attribute("data-refreshes") or 0) >= 3)
    # The log's writes were drawn: the page holds every sample the server does.
    wait.until(lambda d: float(d.find_element(By.ID, "chart-wal").get_attribute("data-max") or 0) > 0)
    charts = drawn_charts(browser)
    history = get(url, "/_sluice/stats/history")
    assert sorted(charts) == ["background", "debt", "device", "latency", "requests", "wal"]
    for name, chart in charts.items():
        assert chart["samples"] >= 3, name
        upto = [k for k, t in enumerate(history["at_ms"]) if t <= chart["last_at"]]
        assert history["at_ms"][upto[-1]] == chart["last_at"], name
        drawn = []
        for line in chart["lines"]:
            series = history["series"][line["series"]]
            assert line["points"] == len(upto), name
            assert line["last"] == series[upto[-1]], name
            drawn += [series[k] for k in upto if series[k] is not None]
        assert chart["max"] == max(drawn, default=0), name
    assert len(charts["requests"]["lines"]) == 2
    assert charts["requests"]["max"] > 0 and charts["wal"]["max"] > 0
    # The figures of now are the API's (nothing writes meanwhile).
    stats = get(url, "/_sluice/stats")
    assert int(text(browser, "wal-durable")) == stats["store"]["wal"]["last_durable"]
    assert int(text(browser, "wal-written")) == stats["store"]["wal"]["last_written"]
    assert int(text(browser, "debt")) == stats["store"]["compaction_debt_bytes"]
    assert float(text(browser, "http-rps")) > 0
    assert text(browser, "resp-rps") != "off"
    browser.execute_script("document.getElementById('live').scrollIntoView()")
    keep_screenshot(browser, "charts")
    assert script_errors(browser) == []


def drawn_charts(browser):
    """What each chart drew, read at one instant (the page redraws every
    second): samples, the last sample's time, the top value and per line
    its series, point count and last value."""
    return browser.execute_script("""
        const out = {};
        for (const svg of document.querySelectorAll("#charts svg")) {
            out[svg.id.replace("chart-", "")] = {
                samples: Number(svg.dataset.samples), last_at: Number(svg.dataset.lastAt),
                max: Number(svg.dataset.max),
                lines: [...svg.querySelectorAll("polyline")].map((l) => ({
                    series: l.dataset.series, points: Number(l.dataset.points), last: Number(l.dataset.last),
                })),
            };
        }
        return out;
    """)


def test_a_store_without_the_papers_says_what_to_do_and_makes_them(tmp_path, sluice_bin, browser):
    server = SluiceServe(sluice_bin, tmp_path / "empty.dev")
    try:
        url = server.url
        # The API's and the Redis keyspace's own keyspaces exist: never shown.
        call(url, "PUT", "/notes", {})
        port = int(re.search(r"Redis protocol .* on 127\.0\.0\.1:(\d+)", "".join(server.banner)).group(1))
        client = redis.Redis(port=port)
        client.set("greeting", "hello")
        client.close()
        open_console(browser, url)
        wait = WebDriverWait(browser, 30)
        wait.until(lambda d: d.find_element(By.ID, "demo-missing").is_displayed())
        step = text(browser, "next-step")
        assert "sluice papers --device DEVICE generate" in step and "Generate" in step, step
        assert not browser.find_element(By.ID, "demo-controls").is_displayed()
        body = browser.find_element(By.TAG_NAME, "body").text
        assert "http." not in body and "redis." not in body, body
        keep_screenshot(browser, "next-step")
        # A demo run asked for anyway says the same, and makes nothing.
        with pytest.raises(urllib.error.HTTPError) as refused:
            post(url, "/_sluice/demo", {"venue": "VLDB", "year": 2010})
        assert refused.value.code == 404
        assert get(url, "/_sluice/keyspaces")["keyspaces"] == [{"name": "default", "format": "raw"}]

        browser.find_element(By.ID, "generate").click()
        wait = WebDriverWait(browser, 120)
        wait.until(lambda d: len(Select(d.find_element(By.ID, "year")).options) > 0)
        assert not browser.find_element(By.ID, "demo-missing").is_displayed()
        assert get(url, "/_sluice/demo") == {"available": True}
        browser.find_element(By.ID, "run").click()
        wait.until(lambda d: text(d, "status") == "done")
        assert int(text(browser, "candidates")) > 0
        # A second data set would mix with the first: refused.
        with pytest.raises(urllib.error.HTTPError) as again:
            post(url, "/_sluice/demo/generate", {"papers": 10})
        assert again.value.code == 409
        assert script_errors(browser) == []
    finally:
        server.stop()
