"""The manifest formats the output checks recognise (cpu_dist/common/files.py) are the ones the
checkpoint, the export bundle and the converted layout write."""

from cpu_dist.checkpoint.manifest import FORMAT as CHECKPOINT
from cpu_dist.common import files
from cpu_dist.data.layout import FORMAT as CONVERTED
from cpu_dist.serving.bundle import FORMAT as EXPORT


def test_one_name_for_each_format():
    assert files.CHECKPOINT_FORMAT == CHECKPOINT
    assert files.CONVERTED_FORMAT == CONVERTED
    assert files.EXPORT_FORMAT == EXPORT
