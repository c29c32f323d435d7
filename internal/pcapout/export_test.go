package pcapout

import (
	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/event"
)

// PacketsAsking and (*Writer).WriteIncidentAsking are Packets and
// WriteIncident with the question name as the query carried it.
func PacketsAsking(inc *correlate.Incident, name event.Name) ([]Packet, error) {
	return packets(inc, asked(name))
}

func (w *Writer) WriteIncidentAsking(inc *correlate.Incident, name event.Name) error {
	return w.writeIncident(inc, asked(name))
}
