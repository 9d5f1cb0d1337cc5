# A stock CAP Python worker of pool "echo" taking topic job.echo, with the
# heartbeat Troupe needs (CAP SDK cap-sdk-python, cordum-io/cap at d880483).
import asyncio
import os

from cap.bus import NATSConfig, connect_nats
from cap.pb.cordum.agent.v1 import buspacket_pb2, heartbeat_pb2, job_pb2
from cap.worker import run_worker

NATS_URL = os.environ.get("NATS_URL", "nats://127.0.0.1:4222")
WORKER_ID = "echo-py-1"  # unique, no '.'
POOL = "echo"            # a pool name from pools.yaml
active = 0               # reported as active_jobs


async def handle(req: job_pb2.JobRequest) -> job_pb2.JobResult:
    global active
    active += 1
    try:
        return job_pb2.JobResult(job_id=req.job_id, status=job_pb2.JOB_STATUS_SUCCEEDED,
                                 result_ptr=req.context_ptr)
    finally:
        active -= 1


async def heartbeats(interval: float = 5.0) -> None:
    # The SDK has no heartbeat helper: publish a Heartbeat packet every interval.
    nc = await connect_nats(NATSConfig(url=NATS_URL, name=WORKER_ID))
    while True:
        packet = buspacket_pb2.BusPacket(sender_id=WORKER_ID, protocol_version=1)
        packet.created_at.GetCurrentTime()
        # run_worker runs one job at a time: announce 1.
        packet.heartbeat.CopyFrom(heartbeat_pb2.Heartbeat(
            worker_id=WORKER_ID, pool=POOL, active_jobs=active, max_parallel_jobs=1))
        await nc.publish("sys.heartbeat", packet.SerializeToString())
        await asyncio.sleep(interval)


async def main() -> None:
    # run_worker opens its own connection; queue group = subject (the topic).
    await asyncio.gather(
        run_worker(NATS_URL, "job.echo", handle, sender_id=WORKER_ID),
        heartbeats(),
    )


if __name__ == "__main__":
    asyncio.run(main())
