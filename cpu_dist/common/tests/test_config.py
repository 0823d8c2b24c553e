import pytest

from cpu_dist.common.config import ClientConfig, Config
from cpu_dist.common.flags import parse_args
from cpu_dist.common.setting_flags import setting_flag
from cpu_dist.common.validate import ConfigError, parse_ps_list, validate

pytestmark = pytest.mark.timeout(30)


def check(argv, world) -> Config:
    args = parse_args(argv)
    before = dict(vars(args))
    cfg = validate(args, world)
    assert vars(args) == before  # validate reads the flags, it does not change them
    return cfg


def test_defaults_fill_in():
    cfg = check([], 3)
    assert cfg.job.worker_num == 2 and cfg.train.sparse_lr == cfg.train.lr
    assert cfg.model.init_scale == pytest.approx(64**-0.5)
    assert cfg.client == ClientConfig() and cfg.cache is None


def test_the_default_bottom_mlp_ends_in_the_embedding_dim():
    cfg = check(["--embedding-dim", "10"], 3)
    assert cfg.model.bot_mlp == (512, 256, 10)


def test_timeouts_are_flags_with_one_definition_each():
    cfg = check(["--rpc-timeout", "7", "--barrier-timeout", "8", "--checkpoint-timeout", "9"], 3)
    assert (cfg.client.rpc_timeout_s, cfg.job.barrier_timeout_s, cfg.checkpoint.timeout_s) == (
        7,
        8,
        9,
    )


def test_settings_are_flat_json_and_name_their_flags():
    s = check(["--arch-mlp-bot", "32-64"], 3).settings()
    assert s["model.bot_mlp"] == [32, 64] and s["cache"] is None
    assert setting_flag("model.bot_mlp") == "--arch-mlp-bot"
    assert setting_flag("train.dense_optimizer") == "--dense-optimizer"


def test_shard_storage_settings_keep_the_keys_checkpoints_record():
    """``Config.storage`` (once ``Config.table``) is recorded as "table.*", the keys that
    manifests already hold and a resume compares (checkpoint.coordinator.MUST_MATCH)."""
    cfg = check(["--ps-admit-after", "3", "--ps-expire-after", "5"], 3)
    assert (cfg.storage.admit_after, cfg.storage.expire_after) == (3, 5)
    s = cfg.settings()
    assert (s["table.admit_after"], s["table.expire_after"]) == (3, 5)
    assert not [k for k in s if k.startswith("storage")]
    assert setting_flag("table.admit_after") == "--ps-admit-after"


def test_original_spellings_are_accepted():
    cfg = check(
        [
            "--worker_num",
            "4",
            "--ps_list",
            "0.0.0.0:8000,0.0.0.0:8001",
            "--max_step",
            "7",
            "--bagpipe-aggregation",
            "collective",
        ],
        6,
    )
    assert (cfg.job.worker_num, cfg.train.max_step, cfg.train.aggregation) == (4, 7, "collective")


@pytest.mark.parametrize(
    "argv,world,needle",
    [
        (
            ["--worker-num", "3", "--batch-size", "100"],
            4,
            "--batch-size 100 is not divisible by --worker-num 3",
        ),
        (["--worker-num", "3"], 3, "leaves no PS rank"),
        (["--worker-num", "5"], 3, "only 3 MPI ranks"),
        (["--worker-num", "0"], 3, "at least one worker"),
        (["--data", "criteo"], 3, "--data criteo needs --data-path"),
        (
            ["--data", "criteo", "--data-path", "/nonexistent.tsv"],
            3,
            "/nonexistent.tsv: no such file",
        ),
        (["--arch-mlp-bot", "512-32"], 3, "must end with --embedding-dim 64"),
        (["--arch-mlp-top", "512-2"], 3, "must end with 1"),
        (["--arch-mlp-bot", "a-b"], 3, "--arch-mlp-bot 'a-b'"),
        (["--lr", "-1"], 3, "--lr -1.0"),
        (["--barrier-timeout", "0"], 3, "--barrier-timeout 0.0"),
        (["--worker-nice", "20"], 3, "--worker-nice 20: must be in 0..19"),
        (["--worker-nice", "-1"], 3, "--worker-nice -1: must be in 0..19"),
        (["--sparse-sync", "async", "--max-staleness", "64"], 3, "must be in 0..63"),
        (["--checkpoint-timeout", "nan"], 3, "--checkpoint-timeout nan"),
        (["--ps_list", "host-without-port"], 3, "expected host:port"),
        (
            ["--worker-num", "1", "--ps_list", "a:1,b:2"],
            2,
            "names 2 addresses but the job has 1 PS",
        ),
        (["--worker-num", "2", "--ps_list", "a:1"], 2, "needs the shards' token"),
    ],
)
def test_impossible_settings_name_the_flag(argv, world, needle, monkeypatch):
    monkeypatch.delenv("CPU_DIST_TOKEN", raising=False)
    with pytest.raises(ConfigError) as err:
        check(argv, world)
    assert needle in str(err.value)


def test_ps_list_parsing():
    assert parse_ps_list("127.0.0.1:1, [::1]:2") == ("127.0.0.1:1", "[::1]:2")
    with pytest.raises(ConfigError):
        parse_ps_list("h:99999")
