// A stock CAP Node worker of pool "echo" taking topic job.echo, with the
// heartbeat Troupe needs (CAP SDK cap-sdk-node, cordum-io/cap at d880483).
// That SDK's startWorker hands its callback to nats.js 2.x where it takes
// none, so its handler never runs: this worker subscribes itself, with the
// SDK's connection helper, subjects and protobuf definitions.
const {
  connectNATS, loadRoot, SUBJECT_RESULT, SUBJECT_HEARTBEAT, DEFAULT_PROTOCOL_VERSION,
} = require("cap-sdk-node");

const NATS_URL = process.env.NATS_URL || "nats://127.0.0.1:4222";
const ID = "echo-node-1"; // unique, no '.'
const POOL = "echo";      // a pool name from pools.yaml
const MAX = 4;            // max_parallel_jobs: Troupe sends no more at once
let active = 0;           // reported as active_jobs

async function handle(req) {
  return { jobId: req.jobId, status: "JOB_STATUS_SUCCEEDED", resultPtr: req.contextPtr };
}

async function main() {
  const nc = await connectNATS({ url: NATS_URL, name: ID });
  const BusPacket = (await loadRoot()).lookupType("cordum.agent.v1.BusPacket");
  const send = (subject, fields) => {
    const now = Date.now();
    nc.publish(subject, BusPacket.encode(BusPacket.fromObject({
      senderId: ID,
      protocolVersion: DEFAULT_PROTOCOL_VERSION,
      createdAt: { seconds: Math.floor(now / 1000), nanos: (now % 1000) * 1e6 },
      ...fields,
    })).finish());
  };

  // The topic; queue group = subject.
  nc.subscribe("job.echo", {
    queue: "job.echo",
    callback: async (err, msg) => {
      const packet = err ? null : BusPacket.decode(msg.data);
      const req = packet && packet.jobRequest;
      if (!req) return;
      active++;
      let res;
      try {
        res = await handle(req);
      } catch (e) {
        res = { jobId: req.jobId, status: "JOB_STATUS_FAILED", errorMessage: String(e) };
      } finally {
        active--;
      }
      send(SUBJECT_RESULT, { traceId: packet.traceId, jobResult: { ...res, workerId: ID } });
    },
  });

  // The SDK has no heartbeat helper: publish a Heartbeat packet every 5 s.
  const beat = () => send(SUBJECT_HEARTBEAT, {
    heartbeat: { workerId: ID, pool: POOL, activeJobs: active, maxParallelJobs: MAX },
  });
  beat();
  setInterval(beat, 5000);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
