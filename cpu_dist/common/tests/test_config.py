import pytest

from cpu_dist.common.config import ConfigError, parse_args, parse_ps_list, validate

pytestmark = pytest.mark.timeout(30)


def check(argv, world):
    args = parse_args(argv)
    validate(args, world)
    return args


def test_defaults_fill_in():
    args = check([], 3)
    assert args.worker_num == 2 and args.sparse_lr == args.lr
    assert args.init_scale == pytest.approx(64**-0.5)


def test_original_spellings_are_accepted():
    args = check(
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
    assert (args.worker_num, args.max_step, args.aggregation) == (4, 7, "collective")


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
    assert parse_ps_list("127.0.0.1:1, [::1]:2") == ["127.0.0.1:1", "[::1]:2"]
    with pytest.raises(ConfigError):
        parse_ps_list("h:99999")
