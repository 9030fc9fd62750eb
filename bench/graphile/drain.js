// graphile-worker for bench/graphile_compare.py: `node drain.js migrate` installs its
// schema; `node drain.js <concurrency> plain|batched` runs every due job once and
// exits, as its CLI's --once does. "batched" is its fastest documented setting: a
// local queue of 500 jobs fetched per statement, completions batched at once.
const { Logger, runMigrations, runOnce } = require("graphile-worker");

// Errors only: its default logs a line per job, which would be most of the work.
const logger = new Logger(() => (level, message) => {
  if (level === "error") console.error(message);
});

async function main() {
  const connectionString = process.env.DATABASE_URL;
  if (process.argv[2] === "migrate") {
    await runMigrations({ connectionString, logger });
    return;
  }
  const concurrency = Number(process.argv[2]);
  const batched = process.argv[3] === "batched";
  const worker = {
    connectionString,
    concurrentJobs: concurrency,
    maxPoolSize: concurrency + 2,
    pollInterval: 100,
    ...(batched ? { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } : {}),
  };
  await runOnce({ preset: { worker }, logger, taskList: { noop: async () => {} } });
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
