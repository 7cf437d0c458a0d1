"""The job-log stream's wire names, shared by the members that answer it and the
clients that read it: `GET /v1/jobs/{id}/log/stream?offset=&tail=&rank=` answers the
bytes [start, end) of the log, raw, with Content-Length = end - start and these headers."""

LOG_STREAM_PATH = "/v1/jobs/{job_id}/log/stream"
MEMBER_LOG_STREAM_PATH = "/cluster/v1/jobs/{job_id}/log/stream"

START = "x-mtgpu-log-start"  # the offset of the first byte sent
END = "x-mtgpu-log-end"  # the log's size when the request came; the next read starts here
FINAL = "x-mtgpu-log-final"  # "1": the job had ended before that size was read, so this is all
STATE = "x-mtgpu-job-state"  # the job's state then
NODE = "x-mtgpu-log-node"  # the member that holds the log
