"""The batch-file parser: `#MTGPU key=value` directives (and `#SBATCH` options, translated
by sbatch.py) -> model.job.JobSpec (see parser.py)."""

from mtgpu.jobfile.parser import (
    DIRECTIVE_PREFIX,
    DIRECTIVES,
    MAX_ARRAY_INDICES,
    SBATCH_OVERRIDE,
    SBATCH_SCRIPT,
    JobFileError,
    ParsedJobFile,
    late_directive_lines,
    parse_array,
    parse_gpus,
    parse_job_file,
    read_job_file,
)

__all__ = [
    "DIRECTIVE_PREFIX",
    "DIRECTIVES",
    "MAX_ARRAY_INDICES",
    "SBATCH_OVERRIDE",
    "SBATCH_SCRIPT",
    "JobFileError",
    "ParsedJobFile",
    "late_directive_lines",
    "parse_array",
    "parse_gpus",
    "parse_job_file",
    "read_job_file",
]
