"""Reads an MLflow run back with the real Python client (mlflow from the venv), for
tests/mlflow.rs. Usage: mlflow_query.py TRACKING_URI RUN_ID [METRIC_KEY...]; prints one
JSON object: status, name, params, tags, artifact paths, how many runs the run's
experiment has, and the full history of each key as [step, value, timestamp] lists."""

import json
import math
import sys

from mlflow.tracking import MlflowClient


def value(v):
    return v if math.isfinite(v) else str(v)


def main():
    uri, run_id, keys = sys.argv[1], sys.argv[2], sys.argv[3:]
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    print(json.dumps({
        "status": run.info.status,
        "run_name": run.info.run_name,
        "experiment_id": run.info.experiment_id,
        "params": run.data.params,
        "tags": run.data.tags,
        "artifacts": sorted(f.path for f in client.list_artifacts(run_id)),
        "runs_in_experiment": len(client.search_runs([run.info.experiment_id])),
        "history": {
            key: [[m.step, value(m.value), m.timestamp] for m in client.get_metric_history(run_id, key)]
            for key in keys
        },
    }))


if __name__ == "__main__":
    main()
