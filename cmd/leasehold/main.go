// Command leasehold is the leasehold lock service and its command-line client.
//
//	leasehold server                 run a node (single node, data in ./leasehold-data)
//	leasehold lock NAME... -- CMD... run CMD while holding lock NAME (several: a lock set)
//	leasehold once KEY -- CMD...     run CMD at most once per KEY
//	leasehold locks [PREFIX]         list locks
//	leasehold kv get|put|del|ls      the fenced key-value store
//	leasehold status                 show the node's status
//	leasehold demo                   replay the paused-client scenario, unfenced and fenced
//
// Clients find the server with --addr or LEASEHOLD_ADDR (default 127.0.0.1:7740).
package main

import (
	"fmt"
	"os"

	"github.com/leasehold/leasehold/verify"
)

// Exit codes of the CLI. CMD's own exit code passes through `leasehold lock` unchanged;
// these are used only when leasehold itself ends the run.
const (
	exitOK          = 0
	exitError       = 1  // the service answered with an error, or an internal failure
	exitUsage       = 64 // bad flags or arguments (EX_USAGE)
	exitUnavailable = 69 // no server could be reached (EX_UNAVAILABLE)
	exitNotAcquired = 75 // the lock was held for the whole wait, or the key's CMD runs elsewhere (EX_TEMPFAIL)
	exitLockLost    = 76 // the lock (or key) was lost while CMD ran; CMD's process group was killed
)

var version = "dev"

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		usage()
		return exitUsage
	}
	switch args[0] {
	case "server":
		return runServer(args[1:])
	case "lock":
		return runLock(args[1:])
	case "once":
		return runOnce(args[1:])
	case "locks":
		return runLocks(args[1:])
	case "watch":
		return runWatch(args[1:])
	case "history":
		return runHistory(args[1:])
	case "status":
		return runStatus(args[1:])
	case "unlock":
		return runForceRelease(args[1:])
	case "kv":
		return runKV(args[1:])
	case "members":
		return runMembers(args[1:])
	case "snapshot":
		return runSnapshot(args[1:])
	case "demo":
		return runDemo(args[1:])
	case demoWorkerCmd:
		return runDemoWorker(args[1:])
	case "verify":
		return runVerify(args[1:])
	case "verify-writer": // the hidden writers of verify
		return verify.WriterMain()
	case "demo-resource":
		return runDemoResource(args[1:])
	case "version", "--version":
		fmt.Println("leasehold", version)
		return exitOK
	case "help", "-h", "--help":
		usage()
		return exitOK
	default:
		fmt.Fprintf(os.Stderr, "leasehold: unknown command %q\n\n", args[0])
		usage()
		return exitUsage
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `leasehold — a lock service whose every grant carries a fencing token.

Usage:
  leasehold server [flags]                  run a node (defaults: API 127.0.0.1:7740,
                                            raft 127.0.0.1:7741, data ./leasehold-data)
  leasehold lock NAME... [flags] -- CMD [ARG...]
                                            run CMD while holding lock NAME; CMD gets
                                            LEASEHOLD_TOKEN and LEASEHOLD_LOCK; several
                                            names are one lock set (all at once, one
                                            token); --shared, --limit N (semaphore)
  leasehold once KEY [flags] -- CMD [ARG...]
                                            run CMD at most once per KEY; later calls
                                            print its stored outcome and exit with its code
  leasehold locks [PREFIX]                  list locks: name, class, holder, token, TTL left
  leasehold watch [PREFIX] [--from REV] [--output json]
                                            stream lock events (acquired, released, expired,
                                            ...) as they happen, resuming across leader
                                            changes; --from INDEX.OFFSET replays from there
  leasehold history NAME [--output json]    a correctness lock's last tenures: holder, token,
                                            from, to, how each ended
  leasehold unlock NAME --force --reason R  operator release: fences the old holder out
  leasehold kv get|put|del|ls ...           the fenced key-value store (put --fence LOCK=TOKEN)
  leasehold status                          show the node's role, leader and counts
  leasehold members list|add|remove         cluster membership
  leasehold snapshot save|restore FILE      back up the whole state; restore into a new data dir
  leasehold demo                            the pause scenario, unfenced then fenced, live
  leasehold verify --url URL                check that YOUR resource refuses stale tokens:
                                            paused writers, porcupine over the history
  leasehold demo-resource [--fenced]        an HTTP resource to try verify on
  leasehold version

Clients reach the server with --addr HOST:PORT or LEASEHOLD_ADDR.
Run 'leasehold COMMAND -h' for the flags of a command.

Exit codes: CMD's own code from 'lock' and 'once' (for a done key: the stored one);
1 error; 64 usage; 69 server unreachable; 75 lock not obtained, or the key's CMD runs
elsewhere; 76 lock or key lost while CMD ran (CMD's process group was killed).
`)
}
