// Package surveyplot draws `dnsrace lab survey --json` results of several
// kernels as one picture (`dnsrace lab compare ... --plot FILE`), with
// gonum.org/v1/plot (pure Go):
//
//   - one panel per scenario with the CDF of lookup latency on a log time
//     axis, from the survey's latency histogram (format 2), with the 2.5 s
//     and 5 s resolver timeouts marked: a stall is a step there;
//   - three bar panels, race, loss and stall rate per scenario.
//
// One colour per input file, in the order given; the legends name each
// file's kernel (`uname -r` as recorded in the file) and, on the CDF panels,
// the resolver each scenario ran with. A format 1 file has no histogram: it
// appears in the legend and the bars, with no CDF line.
//
// The output format follows the file name: .svg or .png.
package surveyplot
