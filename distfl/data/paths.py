"""Before any data loads: the files a config names exist where its choices need them, and a natural
partition has a dataset whose clients come with it (`config.validate` calls `check_data_files`)."""
from __future__ import annotations

from pathlib import Path

from distfl.data.natural import check_natural
from distfl.errors import ConfigError

# data.dataset -> what its data.path must be
DATA_PATHS = {
    "files": "an .npz with x_train, y_train, x_test, y_test, or a folder with train/ and test/ ImageFolder trees",
    "leaf": "a LEAF dataset's data/ folder (train/ and test/, or all_data/)",
    "tff": "the folder with TFF's PREFIX_train.h5 and PREFIX_test.h5",
    "prepared": "the folder `distfl data prepare` wrote",
}


def check_data_files(v: dict) -> None:
    """ConfigError unless data.path and partition.path exist when their choice needs them (they are read
    when the run loads data), a partition file's client count is partition.num_clients, and a natural
    partition fits its dataset. `v`: the dotted config values."""
    dataset = v["data.dataset"]
    needs = {"data.path": (dataset in DATA_PATHS, f"data.dataset={dataset}", DATA_PATHS.get(dataset, "")),
             "partition.path": (v["partition.scheme"] == "file", "partition.scheme=file",
                                "an .npz with one index array per client, client_0 .. client_{N-1}")}
    for key, (needed, choice, what) in needs.items():
        if needed and not v[key]:
            raise ConfigError(f"{choice} needs {key}: {what}")
        if needed and not Path(v[key]).exists():
            raise ConfigError(f"{key}: {v[key]} does not exist (expected {what})")
    if v["partition.scheme"] == "file":
        from distfl.data.partition import file_client_count

        count = file_client_count(v["partition.path"])
        if count != v["partition.num_clients"]:
            raise ConfigError(f"partition.path {v['partition.path']} holds {count} clients but partition.num_clients="
                              f"{v['partition.num_clients']}; set partition.num_clients={count}")
    check_natural(v)
    from distfl.data.text_settings import check_text_settings

    check_text_settings(v)
