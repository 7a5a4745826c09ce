"""End to end in a real browser (Debian's headless Chromium via Selenium, no browser download): a user opens
the experiment in `ragledger ui`, expands the experiment's parent run, selects its two cell runs, opens
MLflow's compare view and reads their EM and F1 there. Then the views ragledger logs for a user to read there: the
runs table's Dataset column, the EM and F1 columns (MLflow 3.17 shows no metric column by default: the user picks
them under Columns, as the test does), a cell run's outcomes_table.json in its artifact viewer, and the Traces tab
with the sampled questions' lineage. And MLflow's "Artifact evaluation" view, where the two cell runs'
outcomes_table.json (logged with log_table) are joined on qid, each run's prediction side by side in one row.
Screenshots go to test-artifacts/ for a human to see.

Needs /usr/bin/chromium and /usr/bin/chromedriver (infra/browser_deps.sh, which infra/test.sh runs)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.fakes.openai_server import ScriptedServer
from tests.servers import free_port
from tests.test_reliability import RAGLEDGER, cli, make_data, reader, write_spec

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
WAIT_S = 90
TRACES = 5  # RAGLEDGER_MLFLOW_TRACES for the run: fewer than its 8 questions, so the sample is visibly bounded



@pytest.fixture
def browser():
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail("Chromium/ChromeDriver missing: run `bash infra/browser_deps.sh` (infra/test.sh does)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={tempfile.mkdtemp(prefix='chromium-')}", "--window-size=1600,1000"):
        options.add_argument(arg)  # without the *-networking flags Chromium stalls on this closed network
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def ui_on_experiment(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("ui")
    make_data(tmp_path, 8)
    with ScriptedServer(answer=reader) as model:
        proc = cli(tmp_path, "run", str(write_spec(tmp_path, model.base_url, name="uicompare")),
                   "--json", str(tmp_path / "summary.json"), env={"RAGLEDGER_MLFLOW_TRACES": str(TRACES)})
        assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    port = free_port()
    with open(tmp_path / "ui.log", "w") as log:
        ui = subprocess.Popen([RAGLEDGER, "ui", "--port", str(port), "--tracking-uri", summary["tracking_uri"]],
                              cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=2):
                break
            assert ui.poll() is None and time.monotonic() < deadline, (tmp_path / "ui.log").read_text()[-2000:]
            time.sleep(1)
        yield url, summary
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=30)


def test_compare_two_cell_runs_in_the_mlflow_ui(browser, ui_on_experiment):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    url, summary = ui_on_experiment
    wait = WebDriverWait(browser, WAIT_S)
    ARTIFACTS.mkdir(exist_ok=True)
    browser.get(f"{url}/#/experiments/{summary['mlflow_experiment_id']}/runs")

    # the runs table: the experiment's parent run, collapsed; expand it to show its cells
    rows = "div.ag-pinned-left-cols-container [role=row]"
    wait.until(lambda d: any("uicompare" in r.text for r in d.find_elements(By.CSS_SELECTOR, rows)))
    expander = wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, f"{rows} button.du-bois-light-btn-link")))
    expander.click()
    cells = sorted(summary["cells"])
    wait.until(lambda d: all(any(c in r.text for r in d.find_elements(By.CSS_SELECTOR, rows)) for c in cells))
    browser.save_screenshot(str(ARTIFACTS / "mlflow-runs-table.png"))  # reads as the grid: retriever · reader · model

    for row in browser.find_elements(By.CSS_SELECTOR, rows):
        if any(c in row.text for c in cells):
            row.find_element(By.CSS_SELECTOR, "input.ag-checkbox-input").click()
    wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "[data-testid=runs-compare-button]"))).click()

    # the compare view: one column per selected run, in the order of the run ids in its URL
    wait.until(lambda d: "compare-runs" in d.current_url)
    metric_link = "div[role=grid] a[title='Plot chart']"
    wait.until(lambda d: any(a.text == "em" for a in d.find_elements(By.CSS_SELECTOR, metric_link)))
    run_ids = json.loads(unquote(browser.current_url.split("runs=")[1].split("&")[0]))
    # the metrics section is two grids side by side: metric names, then their values row by row
    grids = browser.find_elements(By.CSS_SELECTOR, "div[role=grid]")
    at = next(i for i, g in enumerate(grids)
              if any(a.get_attribute("textContent") == "em" for a in g.find_elements(By.CSS_SELECTOR, "a[title='Plot chart']")))
    names = [a.get_attribute("textContent") for a in grids[at].find_elements(By.CSS_SELECTOR, "a[title='Plot chart']")]
    values = [c.get_attribute("textContent") for c in grids[at + 1].find_elements(By.CSS_SELECTOR, "[role=rowgroup] > div")]
    n = len(run_ids)
    shown = {name: values[n * i : n * (i + 1)] for i, name in enumerate(names)}
    em_link = next(a for a in grids[at].find_elements(By.CSS_SELECTOR, "a[title='Plot chart']")
                   if a.get_attribute("textContent") == "em")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", em_link)
    time.sleep(1)  # let the scroll settle before the picture
    browser.save_screenshot(str(ARTIFACTS / "mlflow-compare.png"))

    expected = {summary["mlflow_cell_run_ids"][c]: summary["cells"][c] for c in cells}
    assert sorted(run_ids) == sorted(expected)
    for column, run_id in enumerate(run_ids):
        for metric in ("em", "f1"):
            assert float(shown[metric][column]) == pytest.approx(expected[run_id][metric], abs=0.01), (metric, shown)
    print(f"compare view: EM {shown['em']}, F1 {shown['f1']} for runs {run_ids}; screenshots in {ARTIFACTS}")


def _dismiss_overlays(browser) -> None:
    """Close what MLflow 3.17 opens over the page on a first visit: the assistant panel and feature tips."""
    from selenium.webdriver.common.by import By

    for button in browser.find_elements(By.CSS_SELECTOR, "button[aria-label=Close]"):
        if button.is_displayed():
            button.click()
    for button in browser.find_elements(By.TAG_NAME, "button"):
        if button.is_displayed() and button.text.strip() == "Got it":
            button.click()
    time.sleep(0.5)


def _grid_rows(browser, runs: list[str]) -> dict[str, dict[str, str]]:
    """The rows of the runs table that show one of `runs` (run names), as {run name: {column id: cell text}}; AG
    Grid keeps the pinned run names apart from the other columns, joined here by row index."""
    from selenium.webdriver.common.by import By

    names = {r.get_attribute("row-index"): next((n for n in runs if n in r.text), "")
             for r in browser.find_elements(By.CSS_SELECTOR, "div.ag-pinned-left-cols-container [role=row]")}
    return {names.get(r.get_attribute("row-index"), ""): {c.get_attribute("col-id"): c.text
                                                          for c in r.find_elements(By.CSS_SELECTOR, "[role=gridcell]")}
            for r in browser.find_elements(By.CSS_SELECTOR, "div.ag-center-cols-container [role=row]")}


def _visible_text(browser, text: str) -> list:
    from selenium.webdriver.common.by import By

    literal = json.dumps(text, ensure_ascii=False)  # an XPath string literal; "·" as itself, not \u00b7
    return [e for e in browser.find_elements(By.XPATH, f"//*[contains(text(), {literal})]") if e.is_displayed()]


def test_dataset_metrics_outcome_table_and_traces_in_the_mlflow_ui(browser, ui_on_experiment):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url, summary = ui_on_experiment
    wait = WebDriverWait(browser, WAIT_S)
    ARTIFACTS.mkdir(exist_ok=True)
    experiment_id, cells = summary["mlflow_experiment_id"], sorted(summary["cells"])
    browser.get(f"{url}/#/experiments/{experiment_id}/runs")
    rows = "div.ag-pinned-left-cols-container [role=row]"
    wait.until(lambda d: any("uicompare" in r.text for r in d.find_elements(By.CSS_SELECTOR, rows)))
    _dismiss_overlays(browser)
    default_columns = [h.text for h in browser.find_elements(By.CSS_SELECTOR, ".ag-header-cell") if h.text]
    browser.save_screenshot(str(ARTIFACTS / "mlflow-runs-default.png"))

    # (a) the Dataset column: every run, the cell runs included, names the questions it was run on
    browser.find_element(By.CSS_SELECTOR, f"{rows} button.du-bois-light-btn-link").click()
    wait.until(lambda d: all(c in _grid_rows(d, cells) for c in cells))
    table = _grid_rows(browser, cells)
    for cell in cells:
        assert "jsonl:questions.jsonl" in table[cell]["attributes.`Dataset`"], table[cell]
    browser.save_screenshot(str(ARTIFACTS / "mlflow-runs-dataset.png"))

    # (d) EM and F1 columns: picked under Columns (not shown by default), then read per cell run
    columns = next(b for b in browser.find_elements(By.TAG_NAME, "button") if b.text.strip() == "Columns")
    columns.click()
    for metric in ("em", "f1"):
        wait.until(lambda d, m=metric: [e for e in d.find_elements(
            By.XPATH, f"//span[contains(@class, 'tree-title') and normalize-space(text())='{m}']") if e.is_displayed()]
                   )[0].click()
    columns.click()
    browser.execute_script("document.querySelector('.ag-body-horizontal-scroll-viewport').scrollLeft = 100000")
    wait.until(lambda d: all(_grid_rows(d, cells).get(c, {}).get("metrics.`f1`") not in (None, "") for c in cells))
    table = _grid_rows(browser, cells)
    time.sleep(1)  # let the scroll settle before the picture
    browser.save_screenshot(str(ARTIFACTS / "mlflow-runs-metrics.png"))
    for cell in cells:
        for metric in ("em", "f1"):
            shown = float(table[cell][f"metrics.`{metric}`"])
            assert shown == pytest.approx(summary["cells"][cell][metric], abs=0.01), (cell, metric, table[cell])

    # (b) a cell run's artifacts: outcomes_table.json, shown as a table of question ids and predictions
    cell = cells[0]
    browser.get(f"{url}/#/experiments/{experiment_id}/runs/{summary['mlflow_cell_run_ids'][cell]}/artifacts")
    wait.until(lambda d: _visible_text(d, "outcomes_table.json"))
    _dismiss_overlays(browser)
    _visible_text(browser, "outcomes_table.json")[0].click()
    wait.until(lambda d: _visible_text(d, "View as table") and _visible_text(d, "prediction") and _visible_text(d, "q7"))
    assert _visible_text(browser, "extraction_error") or _visible_text(browser, "correct")
    browser.save_screenshot(str(ARTIFACTS / "mlflow-run-outcomes-table.png"))

    # (c) the experiment's Traces tab: one trace per sampled question; one opened shows the lineage's spans
    next(a for a in browser.find_elements(By.CSS_SELECTOR, "a") if a.is_displayed() and a.text.strip() == "Traces").click()
    wait.until(lambda d: len(_visible_text(d, "Which entry mentions")) >= TRACES)
    _dismiss_overlays(browser)
    questions = {e.text for e in _visible_text(browser, "Which entry mentions")}
    assert len(questions) == TRACES, questions
    browser.save_screenshot(str(ARTIFACTS / "mlflow-traces.png"))
    _visible_text(browser, "Which entry mentions")[0].click()
    wait.until(lambda d: _visible_text(d, "retrieval") and _visible_text(d, "outcome") and _visible_text(d, "generation"))
    assert all(_visible_text(browser, c) for c in cells)
    time.sleep(1)
    browser.save_screenshot(str(ARTIFACTS / "mlflow-trace-lineage.png"))
    print(f"default runs-table columns: {default_columns}; {len(questions)} traces; screenshots in {ARTIFACTS}")


def test_evaluation_view_compares_two_cell_runs_outcome_tables_by_qid(browser, ui_on_experiment, tmp_path):
    """MLflow's "Artifact evaluation" view (the third view-mode button over the runs table, ?compareRunsMode=ARTIFACT):
    the tables logged with log_table by the visible runs, joined row by row on a "Group by" column, one column per
    run showing the "Compare" column. Here: the parent run hidden (eye icon), the two cell runs' outcomes_table.json
    grouped by qid, compared on prediction; each cell's own prediction for one question sits in that question's row."""
    from mlflow.tracking import MlflowClient
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    url, summary = ui_on_experiment
    wait = WebDriverWait(browser, WAIT_S)
    ARTIFACTS.mkdir(exist_ok=True)
    experiment_id, cells = summary["mlflow_experiment_id"], sorted(summary["cells"])
    cell_runs = {summary["mlflow_cell_run_ids"][c]: c for c in cells}

    # what each cell run logged, read back through MLflow: {run id: {qid: prediction}}
    client = MlflowClient(summary["tracking_uri"])
    predictions = {}
    for run_id in cell_runs:
        logged = json.loads(Path(client.download_artifacts(run_id, "outcomes_table.json", str(tmp_path))).read_text())
        at = {name: i for i, name in enumerate(logged["columns"])}
        predictions[run_id] = {row[at["qid"]]: row[at["prediction"]] for row in logged["data"]}
    qids = sorted(set.intersection(*(set(p) for p in predictions.values())))
    differing = [q for q in qids if len({p[q] for p in predictions.values()}) > 1]
    qid = (differing or qids)[-1]  # a question the two cells answered differently, if there is one

    browser.get(f"{url}/#/experiments/{experiment_id}/runs")
    rows = "div.ag-pinned-left-cols-container [role=row]"
    wait.until(lambda d: any("uicompare" in r.text for r in d.find_elements(By.CSS_SELECTOR, rows)))
    _dismiss_overlays(browser)
    browser.find_element(By.CSS_SELECTOR, f"{rows} button.du-bois-light-btn-link").click()
    wait.until(lambda d: all(c in _grid_rows(d, cells) for c in cells))

    # the view-mode buttons over the runs table: Table, Chart, Artifact evaluation
    mode = browser.find_element(By.CSS_SELECTOR, "input[type=radio][value=ARTIFACT]")
    browser.execute_script("arguments[0].click();", mode)
    wait.until(lambda d: "compareRunsMode=ARTIFACT" in d.current_url)
    table_picker = "[data-testid=dropdown-tables]"
    wait.until(lambda d: "outcomes_table.json" in d.find_element(By.CSS_SELECTOR, table_picker).text)
    _dismiss_overlays(browser)

    # the compared runs are the visible ones: hide the parent run (it logs no table), keep the two cell runs
    eye = "input.is-visibility-toggle-checkbox"
    left = {r.get_attribute("row-id"): r for r in browser.find_elements(By.CSS_SELECTOR, rows)
            if r.find_elements(By.CSS_SELECTOR, eye)}  # row ids are run ids; the joined table's rows have none
    assert set(cell_runs) < set(left), (left.keys(), cell_runs)
    for run_id, run_row in left.items():
        if run_id not in cell_runs:
            run_row.find_element(By.CSS_SELECTOR, eye).find_element(By.XPATH, "..").click()

    def group_by(d):
        return d.find_element(By.CSS_SELECTOR, "button[aria-label='Select \"group by\" columns']").text

    wait.until(lambda d: "qid" in group_by(d))
    compare = browser.find_element(By.XPATH, "//button[@role='combobox'][.//span[normalize-space()='Compare:']]")
    compare.click()
    wait.until(lambda d: [e for e in d.find_elements(By.XPATH, "//*[@role='option'][normalize-space()='prediction']")
                          if e.is_displayed()])[0].click()
    wait.until(lambda d: "prediction" in compare.text)
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)  # close the option list before the picture

    # the joined table: one row per qid, one column per compared run (col-id = run id)
    row = f"div.ag-center-cols-container [role=row][row-id='{qid}']"

    def shown(d) -> dict[str, str]:
        return {c.get_attribute("col-id"): c.text for c in d.find_elements(By.CSS_SELECTOR, f"{row} [role=gridcell]")}

    wait.until(lambda d: all(shown(d).get(r) == predictions[r][qid] for r in cell_runs) and len(shown(d)) == 3)
    cells_shown = shown(browser)
    assert set(cells_shown) == {"qid", *cell_runs}, cells_shown  # the parent's column is gone: two runs compared
    assert cells_shown["qid"] == qid
    headers = {r: browser.find_element(By.CSS_SELECTOR, f"[role=columnheader][col-id='{r}']").get_attribute("textContent")
               for r in cell_runs}
    assert all(cell_runs[r] in headers[r] for r in cell_runs), headers  # each column headed by its cell run's name
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});",
                           browser.find_element(By.CSS_SELECTOR, row))
    time.sleep(1)  # let the scroll settle before the picture
    browser.save_screenshot(str(ARTIFACTS / "mlflow-compare-outcomes.png"))
    print(f"evaluation view, {qid}: " + "; ".join(f"{cell_runs[r]} -> {cells_shown[r]!r}" for r in cell_runs)
          + f" ({len(differing)} of {len(qids)} questions answered differently)")
