// Command leasehold is the leasehold lock service and its command-line client.
//
//	leasehold server                 run a node (single node, data in ./leasehold-data)
//	leasehold lock NAME... -- CMD... run CMD while holding lock NAME (several: a lock set)
//	leasehold once KEY -- CMD...     run CMD at most once per KEY
//	leasehold elect NAME -- CMD...   run CMD while leading election NAME
//	leasehold leader NAME            who leads election NAME
//	leasehold observe NAME           every change of leader of election NAME
//	leasehold locks [PREFIX]         list locks
//	leasehold watch [PREFIX]         stream lock events as they happen
//	leasehold history NAME           a lock's last tenures
//	leasehold kv get|put|del|ls      the fenced key-value store
//	leasehold group create|join|status  partitions assigned to live members, with epochs
//	leasehold status                 show the node's status
//	leasehold demo                   replay the paused-client scenario, unfenced and fenced
//
// Clients find the server with --addr or LEASEHOLD_ADDR (default 127.0.0.1:7740).
//
// # Adding a subcommand
//
// The CLI is built on cobra. A subcommand lives in one file, with one constructor,
// func newFooCmd() *cobra.Command, added with one line to the AddCommand call in
// newRootCmd. The constructor declares the flags: addrFlag for a client command (--addr
// and the TLS and token flags, with their environment defaults), outputFlag for
// --output text|json, completeFlag for values shell completion should offer. A client
// command's RunE is clientRun(&addr, func(ctx, c, cmd, args) error {...}): it dials,
// and an error returned is the service's answer (printed, exit code from exitFor). Any
// other RunE returns exitWith(code), or a plain error, which is a usage error: printed
// with the command's name, exit 64. Check flag values in PreRunE so that a bad value
// fails before the server is dialled. Write to cmd.OutOrStdout(): --output json prints
// the RPC's response with printJSON (one document); a stream prints one compact
// protojson object per line. A command taking `NAME... -- CMD [ARG...]` splits its
// arguments with namesAndCommand (cobra's ArgsLenAtDash).
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

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

// exitCodeError carries a command's exit code out of cobra: the command has already
// said what there was to say.
type exitCodeError struct{ code int }

func (e *exitCodeError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// exitWith is what a command's RunE returns: nil for exitOK, else the code to exit with.
func exitWith(code int) error {
	if code == exitOK {
		return nil
	}
	return &exitCodeError{code}
}

// run runs the CLI on args (without the program name) and returns the exit code. Any
// error that is not an exitCodeError — an unknown command or flag, a wrong number of
// arguments, a bad flag value — is a usage error: it is printed, and the code is 64.
func run(args []string) int {
	return runWith(args, os.Stdout, os.Stderr)
}

func runWith(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	var ec *exitCodeError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ec):
		return ec.code
	}
	fmt.Fprintf(stderr, "%s: %v\nRun '%s -h' for usage.\n", cmd.CommandPath(), err, cmd.CommandPath())
	return exitUsage
}

// newRootCmd builds the whole command tree, writing to stdout and stderr.
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "leasehold",
		Short: "a lock service whose every grant carries a fencing token",
		Long: `leasehold — a lock service whose every grant carries a fencing token.

Clients reach the server with --addr HOST:PORT or LEASEHOLD_ADDR (TLS: --cacert, --cert,
--key or LEASEHOLD_CACERT, LEASEHOLD_CERT, LEASEHOLD_KEY; a token: --auth-token-file or
LEASEHOLD_AUTH_TOKEN). Listings and status take --output json (-o json).

Exit codes: CMD's own code from 'lock', 'elect' and 'once' (for a done key: the stored one);
1 error; 64 usage; 69 server unreachable; 75 lock not obtained, or the key's CMD runs
elsewhere; 76 lock or key lost while CMD ran (CMD's process group was killed).`,
		Version:       version,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE:          usageOnly, // without a command, leasehold shows its usage and exits 64
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("leasehold {{.Version}}\n")
	root.AddCommand(
		newServerCmd(),
		newLockCmd(),
		newOnceCmd(),
		newElectCmd(),
		newLeaderCmd(),
		newObserveCmd(),
		newLocksCmd(),
		newWatchCmd(),
		newHistoryCmd(),
		newUnlockCmd(),
		newKVCmd(),
		newStatusCmd(),
		newMembersCmd(),
		newGroupCmd(),
		newSnapshotCmd(),
		newDemoCmd(),
		newDemoWorkerCmd(),
		newVerifyCmd(),
		newDemoResourceCmd(),
		newVersionCmd(),
		newVerifyWriterCmd(),
		newRunGuardCmd(),
	)
	// cobra's `completion bash|zsh|fish|powershell` (writing to stdout, so after SetOut);
	// without a shell, or with another one, it is a usage error like any other.
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.RunE = usageOnly
		}
	}
	return root
}

// usageOnly is the RunE of a command that only groups subcommands: run without one, it
// shows its help on standard error and exits 64.
func usageOnly(cmd *cobra.Command, _ []string) error {
	cmd.SetOut(cmd.ErrOrStderr())
	_ = cmd.Help()
	return exitWith(exitUsage)
}

// newVerifyWriterCmd is the hidden command verify runs its writers as
// (verify.WriterMain); it takes no flags.
func newVerifyWriterCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "verify-writer",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE:               func(*cobra.Command, []string) error { return exitWith(verify.WriterMain()) },
	}
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print leasehold's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), "leasehold", version)
			return nil
		},
	}
}
